// Command rdsctl runs the driver's RouterOS operations by hand: the same
// validated commands and parsers the CSI driver uses, for operators checking
// an RDS (or the simulator) and for `make demo`.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/crypto/ssh"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/flagonce"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/version"
)

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli runs rdsctl and returns its exit status: 0 (also for -h), 1 when the
// command failed, 2 for a usage error.
func cli(args []string, stdout, stderr io.Writer) int {
	err := run(args, stdout, stderr)
	var usage usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "rdsctl: %v (rdsctl -h shows the commands and flags)\n", err)
		return 2
	default:
		fmt.Fprintln(stderr, "rdsctl:", err)
		return 1
	}
}

// usageError: the command line itself is wrong; nothing was done.
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

const usage = `usage: rdsctl [flags] COMMAND [ARGS] [flags]
       rdsctl --version

commands:
  probe                         /system resource print
  capacity                      pool size and free space
  list                          every file-backed disk
  get SLOT                      one disk
  create SLOT SIZE              new exported disk; with -closed, exported to no host until
                                'export SLOT on HOSTNQN|any'
  resize SLOT SIZE              grow a disk (a SIZE below its size is refused: disks never shrink)
  copy SLOT SOURCE [SIZE]       copy a disk (snapshot/clone/restore); not exported
  delete SLOT                   remove a disk and its backing file (a volume or snapshot of the driver)
  allow-host SLOT [HOSTNQN]     set the allowed host alone (empty clears), unconditionally; it
                                may leave connections of another host established: prefer export
  export SLOT on HOSTNQN|any    open the export to one host NQN (or any host), as the driver's
                                storage fencing does: moving it from another host turns it off
                                first (drops every connection), sets the host, turns it on
                                (-keep-connections: set the host only); prints the gap
  export SLOT off [HOSTNQN]     close the export (drops every connection) and clear its allowed
                                host, only while it is exported to HOSTNQN (default: the host
                                it is exported to now)
  selftest                      create, print, fence, resize, snapshot, restore and delete scratch
                                disks (rdsctl-selftest-*, exported only to random host NQNs),
                                check every parse, report each RouterOS fact of docs/routeros.md
                                as confirmed, contradicted or skipped (-o json; -data also checks
                                a copy's data over NVMe/TCP); removes its disks on every exit,
                                Ctrl-C included
  gen-key PATH                  write a new ed25519 key pair (PATH, PATH.pub; neither may exist) for
                                the driver's RDS user

SIZE is bytes or a number with a binary unit: 1073741824, 10G, 1536M, 1.5G (k, M, G, T;
whole bytes only). Flags may come before or after the command, each once; a flag marked for
some commands below (selftest:, create:, export on:) is refused by the others; -address is a
host name or IP address alone (the port is -port); -key is the private key, not its .pub.

exit status: 0 done, 1 the command failed, 2 a usage error (bad flag or argument; nothing done).

flags (docs/flags.md says each in full):
`

// argCounts are the commands and how many arguments each takes (min, max).
var argCounts = map[string][2]int{
	"probe": {0, 0}, "capacity": {0, 0}, "list": {0, 0}, "selftest": {0, 0},
	"get": {1, 1}, "create": {2, 2}, "resize": {2, 2}, "copy": {2, 3}, "delete": {1, 1},
	"allow-host": {1, 2}, "export": {2, 3}, "gen-key": {1, 1},
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		fmt.Fprintln(stdout, version.Version)
		return nil
	}
	fs := flag.NewFlagSet("rdsctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg       rds.Config
		pool      = fs.String("pool", "storage-pool", "mount point of the storage pool on the RDS")
		basePath  = fs.String("base-path", rds.DefaultVolumePath, "directory of the disks' backing files on the RDS (the driver's --rds-volume-path)")
		nqnPrefix = fs.String("nqn-prefix", "nqn.2000-02.com.mikrotik:", "NQN prefix of exported disks")
		nvmePort  = fs.Int("nvme-port", 4420, "NVMe/TCP port of exported disks (1-65535)")
		show      = fs.Bool("show-commands", false, "print each RouterOS command and what RouterOS returned")
		closed    = fs.Bool("closed", false, "create: set the NVMe/TCP port and NQN but export to no host")
		keepConns = fs.Bool("keep-connections", false, "export on: move the export's host without turning it off and on")
		timeout   = fs.Duration("timeout", time.Minute, "overall timeout (at least 1s)")
		verbose   = fs.Bool("v", false, "log what the client does on stderr")
		selftestF = addSelftestFlags(fs) // selftest.go
	)
	fs.StringVar(&cfg.Address, "address", "127.0.0.1", "RDS address: a host name or IP address, no port (-port)")
	fs.IntVar(&cfg.Port, "port", 22, "RDS SSH port (1-65535)")
	fs.StringVar(&cfg.User, "user", "admin", "RDS user")
	fs.StringVar(&cfg.LoginOptions, "login-options", rds.DefaultLoginOptions, "RouterOS console login options sent after '+' in the user name; none: none")
	fs.StringVar(&cfg.KeyFile, "key", "", "SSH private key file")
	fs.StringVar(&cfg.KnownHostsFile, "known-hosts", "", "known_hosts file pinning the RDS host key")
	fs.BoolVar(&cfg.InsecureSkipHostKeyCheck, "insecure-skip-host-key-check", false, "accept any host key (labs only)")
	fs.Usage = func() {}     // -h prints to stdout below
	fs.SetOutput(io.Discard) // a flag error is one line, from cli
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil
	}
	if err != nil {
		return usageError{err}
	}
	if len(pos) == 0 {
		return usagef("no command")
	}
	cmd, rest := pos[0], pos[1:]
	counts, ok := argCounts[cmd]
	switch {
	case !ok:
		return usagef("unknown command %q", cmd)
	case len(rest) < counts[0] || len(rest) > counts[1]:
		return usagef("%s takes %s, not %d: %q", cmd, countText(counts), len(rest), rest)
	}
	a, err := parseArguments(cmd, rest)
	if err != nil {
		return err
	}
	if err := rds.ValidateHost(cfg.Address); err != nil {
		return usagef("-address: %v (the port is -port)", err)
	}
	if selftestF.nvmeAddress != "" {
		if err := rds.ValidateHost(selftestF.nvmeAddress); err != nil {
			return usagef("-nvme-address: %v (the port is -nvme-port)", err)
		}
	}
	if err := checkCommandFlags(fs, cmd); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	// Flags that mean something only with another one, or one form of
	// their command: refused rather than silently ignored.
	switch {
	case given["nvme-address"] && !selftestF.data:
		return usagef("-nvme-address needs -data: only the data check connects over NVMe/TCP (without -data the self-test runs whole, ignoring it)")
	case given["keep-connections"] && len(rest) > 1 && rest[1] == "off":
		return usagef("-keep-connections is a flag of export on, not export off: closing an export always drops its connections")
	}
	if err := selftestF.validate(); err != nil {
		return err
	}
	if err := rds.ValidatePort(cfg.Port); err != nil {
		return usagef("-port: %v", err)
	}
	if err := rds.ValidateLoginOptions(cfg.LoginOptions); err != nil {
		return usagef("-login-options: %v", err)
	}
	if err := rds.ValidatePort(*nvmePort); err != nil {
		return usagef("-nvme-port: %v", err)
	}
	if *timeout < minTimeout {
		return usagef("-timeout must be at least %v (a connection and a command), not %v", minTimeout, *timeout)
	}
	if err := rds.ValidatePoolName(*pool); err != nil {
		return usagef("-pool: %v", err)
	}
	if err := rds.ValidateFilePath(*basePath); err != nil {
		return usagef("-base-path: %v", err)
	}
	// The driver's volume IDs (pvc-<uuid>, 40 bytes) must fit after it.
	if err := rds.ValidateNQN(*nqnPrefix + "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"); err != nil || !strings.HasPrefix(*nqnPrefix, "nqn.") {
		return usagef("-nqn-prefix %q does not form valid NQNs, or leaves no room for a volume ID (pvc-<uuid>, 40 bytes) under the NQN's 223: at most 183 bytes (e.g. nqn.2000-02.com.mikrotik:)", *nqnPrefix)
	}
	quietLogs(*verbose)
	if cmd == "gen-key" {
		return genKey(a.path, stdout)
	}
	switch {
	case cfg.User == "":
		return usagef("-user is empty: the RDS user the key belongs to")
	case cfg.KeyFile == "":
		return usagef("-key is required: the RDS user's SSH private key file (rdsctl gen-key writes a pair)")
	case cfg.KnownHostsFile == "" && !cfg.InsecureSkipHostKeyCheck:
		return usagef("-known-hosts is required: a known_hosts file pinning the RDS host key (ssh-keyscan -p PORT ADDRESS writes one); -insecure-skip-host-key-check for labs")
	case *show && selftestF.output == "json":
		return usagef("-o json with -show-commands: the transcript would break the JSON document; use one of them")
	}
	if err := checkNotPublicKey(cfg.KeyFile); err != nil {
		return err
	}
	out := stdout
	if cmd == "selftest" {
		// The transcript and the report: a reader gone (a closed pipe)
		// stops the checks, and the cleanup runs (selftestWithSignals).
		out = watchOutput(stdout)
	}
	if *show {
		cfg.Observer = func(r rds.CommandRecord) {
			fmt.Fprintf(out, "  > %s\n", r.Command)
			for _, l := range strings.Split(strings.TrimRight(r.Output, "\r\n"), "\n") {
				if l != "" {
					fmt.Fprintf(out, "  < %s\n", l)
				}
			}
			if r.Err != nil {
				fmt.Fprintf(out, "  ! %v\n", r.Err)
			}
		}
	}
	if cmd == "selftest" {
		return selftestCommand(cfg, selftestOptions{pool: *pool, basePath: *basePath, nqnPrefix: *nqnPrefix, nvmePort: *nvmePort,
			timeout: *timeout, loginOptions: cfg.LoginOptions}, selftestF, out)
	}
	client, err := rds.NewClient(cfg)
	if err != nil {
		// NewClient dials nothing: what it refuses (an unreadable or
		// unusable -key or -known-hosts, bad -login-options) is what the
		// command line named.
		return usageError{err}
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	file := func(slot string) string { return rds.VolumeFilePath(*basePath, slot) }
	switch cmd {
	case "probe":
		info, err := client.Probe(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "RDS %s, RouterOS %s, up %s\n", info.BoardName, info.Version, info.Uptime)
	case "capacity":
		c, err := client.Capacity(ctx, *pool)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "pool %s: %d bytes total, %d bytes free\n", *pool, c.Total, c.Free)
	case "list":
		disks, err := client.ListDisks(ctx)
		if err != nil {
			return err
		}
		printDisks(stdout, disks...)
	case "get":
		d, err := client.GetDisk(ctx, a.slot)
		if err != nil {
			return err
		}
		printDisks(stdout, *d)
	case "create":
		// The client's create is idempotent for the driver's retries: an
		// existing disk that matches is returned as created. By hand, that
		// would hide that nothing was done (and -closed on an open disk).
		switch d, err := client.GetDisk(ctx, a.slot); {
		case err == nil:
			return fmt.Errorf("disk %s exists already (%d bytes, %s); nothing changed", d.Slot, d.Size, exportText(d))
		case !errors.Is(err, rds.ErrNotFound):
			return err
		}
		// The file path is the slot's own (named as the driver names a
		// volume's), so a file there that no disk uses is debris of an
		// earlier attempt whose clean-up failed: the client removes it
		// and adds again, as for the driver's CreateVolume.
		d, err := client.CreateDisk(ctx, rds.CreateDiskRequest{Slot: a.slot, FilePath: file(a.slot), Size: a.size,
			Export: &rds.Export{Port: *nvmePort, NQN: *nqnPrefix + a.slot, Closed: *closed}, OwnsFilePath: true})
		if err != nil {
			return err
		}
		printDisks(stdout, *d)
	case "resize":
		return resize(ctx, client, a, stdout)
	case "copy":
		// The copy's whole export is set (closed, its own NQN and port):
		// RouterOS's copy-from may take the source's (docs/routeros.md).
		// The file path is the slot's own, so a file there that no disk
		// uses is a copy's leftover: the client removes it once the RDS's
		// clock says no copy can still be writing it, as for the driver's
		// clones and restores.
		d, err := client.CopyDisk(ctx, rds.CopyDiskRequest{Slot: a.slot, FilePath: file(a.slot), SourceSlot: a.source, Size: a.size,
			Export: &rds.Export{Port: *nvmePort, NQN: *nqnPrefix + a.slot, Closed: true}, OwnsFilePath: true})
		if err != nil {
			return err
		}
		printDisks(stdout, *d)
	case "delete":
		// The disk's own file, if it is one of the driver's: a volume
		// (<base>/<slot>.img) or a snapshot (<base>/snapshots/<slot>.*.img).
		d, err := client.GetDisk(ctx, a.slot)
		if err != nil {
			return err
		}
		if d.FilePath == "" {
			return fmt.Errorf("disk %s has no backing file (not a file-backed disk), so it is not a volume or snapshot of the driver; refusing to delete", d.Slot)
		}
		if rds.FileKind(*basePath, *d) == "" {
			return fmt.Errorf("disk %s uses %s, not a volume or snapshot file under --base-path %s; refusing to delete", d.Slot, d.FilePath, *basePath)
		}
		if err := client.DeleteDisk(ctx, d.Slot, d.FilePath); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted %s and %s\n", d.Slot, d.FilePath)
	case "allow-host":
		if err := client.SetAllowedHost(ctx, a.slot, a.host); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: allowed host %q\n", a.slot, a.host)
	case "export":
		return exportCommand(ctx, client, rest, !*keepConns, stdout)
	}
	return nil
}

// minTimeout is the shortest -timeout: an SSH connection and one command
// take longer, so less would fail every command.
const minTimeout = time.Second

// commandFlags are the flags only some commands use, and those commands:
// given to another command such a flag would be ignored (`list -o json`
// printing a table), so it is refused instead. The connection and layout
// flags (-address, -pool, -base-path, ...) are taken by every command.
var commandFlags = map[string][]string{
	"o": {"selftest"}, "data": {"selftest"}, "nvme-address": {"selftest"}, "copy-wait": {"selftest"},
	"closed": {"create"}, "keep-connections": {"export"},
}

func checkCommandFlags(fs *flag.FlagSet, cmd string) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if cmds, ok := commandFlags[f.Name]; ok && err == nil && !slices.Contains(cmds, cmd) {
			err = usagef("-%s is a flag of %s only, not of %s", f.Name, strings.Join(cmds, ", "), cmd)
		}
	})
	return err
}

// checkNotPublicKey names the mistake when -key is the .pub file that
// gen-key (or ssh-keygen) writes beside the private key: the SSH library
// would say only "no key found".
func checkNotPublicKey(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil // unreadable: the client says so, naming the file
	}
	if !rds.IsPublicKey(data) {
		return nil
	}
	return usagef("-key %s is a public key; -key wants the private key (%s)", path, strings.TrimSuffix(path, ".pub"))
}

func countText(c [2]int) string {
	switch {
	case c[1] == 0:
		return "no arguments"
	case c[0] == c[1]:
		return fmt.Sprintf("%d argument(s)", c[0])
	default:
		return fmt.Sprintf("%d to %d arguments", c[0], c[1])
	}
}

// parseInterspersed parses flags placed before, between or after the
// arguments (`rdsctl list -show-commands`), so that none is silently
// taken for an argument or ignored; "--" ends the flags. Each flag is
// given once (flagonce). A negative number is an argument, not a flag
// (no flag of rdsctl starts with a digit): `create pvc-1 -1` is refused
// for its size, unless it is the value of the flag before it
// (`-timeout -1s`).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		switch {
		case arg == "--":
			return pos, flagonce.Parse(fs, flags)
		case len(arg) < 2 || arg[0] != '-' || negativeNumber(arg):
			pos = append(pos, arg)
			continue
		}
		flags = append(flags, arg)
		name, _, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if f := fs.Lookup(name); f != nil && !hasValue && !isBoolFlag(f) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return pos, flagonce.Parse(fs, flags)
}

func negativeNumber(arg string) bool {
	return len(arg) > 1 && arg[0] == '-' && (arg[1] >= '0' && arg[1] <= '9' || arg[1] == '.')
}

// isBoolFlag: a flag that takes no separate value (-v, not -v true).
func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// arguments are a command's arguments, checked before anything is
// dialled: a slot, size or host NQN that cannot be right is a usage error
// (exit 2, nothing done), not a failure of the RDS.
type arguments struct {
	slot   string
	source string // copy
	size   int64  // create, resize, copy (0: the source's)
	// sizeArg is the size as given, for messages.
	sizeArg string
	host    string // allow-host ("" clears)
	path    string // gen-key
}

func parseArguments(cmd string, rest []string) (arguments, error) {
	var a arguments
	fail := func(err error) (arguments, error) { return arguments{}, usagef("%s: %v", cmd, err) }
	switch cmd {
	case "probe", "capacity", "list", "selftest":
		return a, nil
	case "gen-key":
		if rest[0] == "" {
			return fail(errors.New("PATH is empty"))
		}
		a.path = rest[0]
		return a, nil
	}
	a.slot = rest[0]
	if err := rds.ValidateSlot(a.slot); err != nil {
		return fail(err)
	}
	sizeAt := -1
	switch cmd {
	case "create", "resize":
		sizeAt = 1
	case "copy":
		a.source = rest[1]
		if err := rds.ValidateSlot(a.source); err != nil {
			return fail(fmt.Errorf("SOURCE: %w", err))
		}
		if a.source == a.slot {
			return fail(fmt.Errorf("SLOT and SOURCE are both %q: a disk cannot be copied onto itself", a.slot))
		}
		if len(rest) > 2 {
			sizeAt = 2
		}
	case "allow-host":
		if len(rest) > 1 && rest[1] != "" {
			a.host = rest[1]
			if err := rds.ValidateNQN(a.host); err != nil {
				return fail(fmt.Errorf("%w (an empty HOSTNQN, \"\", clears the allowed host)", err))
			}
		}
	}
	if sizeAt >= 0 {
		a.sizeArg = rest[sizeAt]
		size, err := rds.ParseSizeArgument(a.sizeArg)
		if err == nil {
			_, err = rds.RoundUpSize(size) // the size the disk gets; a size too large for it is the input's fault
		}
		if err != nil {
			return fail(err)
		}
		a.size = size
	}
	return a, nil
}

// quietLogs keeps the client's INFO lines (export changes, retries) off
// the terminal unless -v: stdout is rdsctl's answer, stderr its errors and
// warnings (such as the insecure host key check).
func quietLogs(verbose bool) {
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	threshold := "WARNING"
	if verbose {
		threshold = "INFO"
	}
	for name, value := range map[string]string{"logtostderr": "true", "legacy_stderr_threshold_behavior": "false", "stderrthreshold": threshold} {
		if err := kfs.Set(name, value); err != nil {
			panic(err) // a klog without these flags: a build problem, not an input
		}
	}
}

// resize grows a disk; a size below the disk's is refused, since disks
// never shrink (the client would return the disk unchanged).
func resize(ctx context.Context, client *rds.Client, a arguments, stdout io.Writer) error {
	want, err := rds.RoundUpSize(a.size)
	if err != nil {
		return fmt.Errorf("size %q: %w", a.sizeArg, err)
	}
	d, err := client.GetDisk(ctx, a.slot)
	if err != nil {
		return err
	}
	if d.Size > want {
		return fmt.Errorf("%w: disk %s has %d bytes, more than the %d of size %q: disks never shrink (create a smaller disk and copy the data instead)", rds.ErrInvalidArgument, a.slot, d.Size, want, a.sizeArg)
	}
	if d, err = client.ResizeDisk(ctx, a.slot, a.size); err != nil {
		return err
	}
	printDisks(stdout, *d)
	return nil
}

func printDisks(out io.Writer, disks ...rds.Disk) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SLOT\tSIZE (bytes)\tEXPORTED\tPORT\tNQN\tALLOWED HOST\tFILE")
	for _, d := range disks {
		allowed := d.AllowHost
		if allowed == "" {
			allowed = "any"
		}
		fmt.Fprintf(w, "%s\t%d\t%v\t%d\t%s\t%s\t%s\n", d.Slot, d.Size, d.Exported, d.Port, d.NQN, allowed, d.FilePath)
	}
	w.Flush()
}

// exportCommand is `export SLOT on HOSTNQN|any` and `export SLOT off
// [HOSTNQN]`: the driver's own storage-fencing calls, for operators.
func exportCommand(ctx context.Context, client *rds.Client, args []string, drop bool, stdout io.Writer) error {
	if len(args) < 2 || (args[1] != "on" && args[1] != "off") || (args[1] == "on" && len(args) != 3) || len(args) > 3 {
		return usagef("usage: export SLOT on HOSTNQN|any, or export SLOT off [HOSTNQN]")
	}
	slot := args[0]
	host := ""
	if len(args) == 3 && args[2] != "any" {
		host = args[2]
		// "" is not "any": an unset variable must not open an export
		// to every host. Any host is said with the word.
		if err := rds.ValidateNQN(host); err != nil {
			return usagef("export %s %s: host %q: %v (say \"any\" for any host)", slot, args[1], host, err)
		}
	}
	label := host
	if label == "" {
		label = "any host"
	}
	if args[1] == "on" {
		ch, err := client.SetExportHost(ctx, slot, host, drop)
		if err != nil {
			return err
		}
		switch {
		case !ch.Changed:
			fmt.Fprintf(stdout, "%s: already exported to %s\n", slot, label)
		case ch.Dropped:
			fmt.Fprintf(stdout, "%s: exported to %s; established connections dropped, no host could connect for %v\n", slot, label, ch.Gap)
		case ch.Before.Exported:
			fmt.Fprintf(stdout, "%s: exported to %s, was %s; established connections NOT dropped\n", slot, label, allowedLabel(ch.Before.AllowHost))
		default:
			fmt.Fprintf(stdout, "%s: exported to %s (was not exported)\n", slot, label)
		}
		return nil
	}
	d, err := client.GetDisk(ctx, slot)
	if err != nil {
		return err
	}
	if len(args) == 2 {
		host, label = d.AllowHost, allowedLabel(d.AllowHost)
	}
	changed, err := client.CloseExport(ctx, slot, host)
	if err != nil {
		return err
	}
	if !changed {
		if !d.Exported {
			fmt.Fprintf(stdout, "%s: already not exported\n", slot)
			return nil
		}
		return fmt.Errorf("%s is exported to %s, not %s: left open (close it with 'export %s off %s')", slot, allowedLabel(d.AllowHost), label, slot, argHost(d.AllowHost))
	}
	fmt.Fprintf(stdout, "%s: export closed (was exported to %s); established connections dropped\n", slot, label)
	return nil
}

// exportText says how a disk is exported, for messages.
func exportText(d *rds.Disk) string {
	if !d.Exported {
		return "not exported"
	}
	return "exported to " + allowedLabel(d.AllowHost)
}

func allowedLabel(host string) string {
	if host == "" {
		return "any host"
	}
	return host
}

func argHost(host string) string {
	if host == "" {
		return "any"
	}
	return host
}

// genKey writes an unencrypted ed25519 private key (it is mounted from a
// Kubernetes Secret, which is where its protection lives) and its public
// key in authorized_keys form, for `/user ssh-keys import` on the RDS.
// Neither file may exist: a key pair is never half replaced (a PATH.pub
// left beside a moved-away key may be the one the RDS trusts).
func genKey(path string, stdout io.Writer) (err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	block, err := ssh.MarshalPrivateKey(priv, "rds-csi")
	if err != nil {
		return err
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return err
	}
	// Both are created exclusively before either is written; what this
	// call created is removed again if anything fails.
	var created []string
	defer func() {
		if err != nil {
			for _, p := range created {
				os.Remove(p)
			}
		}
	}()
	create := func(p string, mode os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("%s exists already: gen-key writes a new pair and replaces neither file (move it away or choose another PATH)", p)
		}
		if err == nil {
			created = append(created, p)
		}
		return f, err
	}
	keyFile, err := create(path, 0o600)
	if err != nil {
		return err
	}
	defer keyFile.Close()
	pubFile, err := create(path+".pub", 0o644)
	if err != nil {
		return err
	}
	defer pubFile.Close()
	if err := pem.Encode(keyFile, block); err != nil {
		return err
	}
	if _, err := pubFile.Write(ssh.MarshalAuthorizedKey(sshPub)); err != nil {
		return err
	}
	for _, f := range []*os.File{keyFile, pubFile} {
		if err := f.Close(); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "wrote %s and %s (%s)\n", path, path+".pub", ssh.FingerprintSHA256(sshPub))
	return nil
}
