// Command rds-sim runs the RDS simulator (pkg/rds/rdssim) as a standalone
// SSH server, for local runs and demos:
//
//	rds-sim --data-dir /tmp/rds --authorized-keys ~/.ssh/id_ed25519.pub
//	ssh -p 2222 -i ~/.ssh/id_ed25519 admin@127.0.0.1 '/system resource print'
//
// Where the kernel's NVMe target is available (configfs with nvmet and
// nvmet-tcp loaded), disks with nvme-tcp-export=yes are exported through it
// (--nvme-export, see rdssim.NvmetExporter).
//
// What a change of a disk's nvme-tcp-server-allow-host-name does to the
// connections already established to its export is not known on RouterOS;
// --allow-host-change picks it: keep (the default, as Linux nvmet does) or
// drop. nvme-tcp-export=no drops them either way.
//
// --fault-control=<path> serves a unix socket (mode 0600) through which
// another process, such as an e2e test, arms faults while the simulator
// runs: one request per line, one answer line each ("ok ..." or
// "error: ..."), for example a command that lands late, after its client's
// command timeout and after later commands:
//
//	late match="nvme-tcp-export=no] nvme-tcp-export=yes" delay=6s count=1
//	release
//
// The requests are listed under -help and in pkg/rds/rdssim/faultcontrol.go.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
	"github.com/srvlab/rds-csi/pkg/version"
)

type options struct {
	listen         string
	dataDir        string
	poolName       string
	poolSize       string
	hostKey        string
	authorizedKeys string
	knownHostsOut  string
	latency        time.Duration
	crlf           bool
	terminalWidth  int
	exitOnFailure  bool
	copyRate       string
	nvmeExport     string
	nvmetRoot      string
	nvmetAddress   string
	allowHostChg   string
	faultControl   string
	copyFromProps  string
	copyFromData   string
	closedProps    string
	globalReqs     string
	valueBreak     string
	legend         string
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.listen, "listen", "127.0.0.1:2222", "SSH address to listen on, host:port (port 0: any free one)")
	fs.StringVar(&o.dataDir, "data-dir", "", "directory of the pool's disk files and the simulator's state (required)")
	fs.StringVar(&o.poolName, "pool-name", rdssim.DefaultPoolName, "slot and mount point of the pool disk")
	fs.StringVar(&o.poolSize, "pool-size", "100G", "pool capacity: bytes or a k/K/M/G/T suffixed size")
	fs.StringVar(&o.hostKey, "host-key", "", "SSH host key file, generated if missing (default <data-dir>/.rdssim-host-key)")
	fs.StringVar(&o.authorizedKeys, "authorized-keys", "", "authorized_keys file of the keys allowed to log in (required)")
	fs.StringVar(&o.knownHostsOut, "write-known-hosts", "", "write a known_hosts file pinning the host key for the listen address")
	fs.DurationVar(&o.latency, "latency", 0, "delay added before every command (0 to 1h)")
	fs.BoolVar(&o.crlf, "crlf", false, "end output lines with CRLF")
	fs.IntVar(&o.terminalWidth, "terminal-width", rdssim.DefaultTerminalWidth, "wrap print output at this many columns (-1: no wrapping; else at least 40)")
	fs.StringVar(&o.copyRate, "copy-rate", "0", "bytes per second copy-from copies (k/K/M/G/T suffix; 0: at once)")
	fs.BoolVar(&o.exitOnFailure, "exit-status-on-failure", false, "exit with status 1 from a refused command")
	fs.StringVar(&o.nvmeExport, "nvme-export", "auto", "export disks through the kernel's NVMe/TCP target: nvmet, none or auto")
	fs.StringVar(&o.nvmetRoot, "nvmet-root", rdssim.DefaultNvmetRoot, "the nvmet configfs directory")
	fs.StringVar(&o.nvmetAddress, "nvmet-address", "127.0.0.1", "IP address the NVMe/TCP ports listen on")
	fs.StringVar(&o.faultControl, "fault-control", "", "unix socket to serve the fault control protocol on (below); empty: none")
	fs.StringVar(&o.copyFromProps, "copy-from-properties", string(rdssim.CopyFromInherit), "where copy-from takes properties the add does not set: inherit or fresh")
	fs.StringVar(&o.copyFromData, "copy-from-data", string(rdssim.CopyFromDataCopy), "what copy-from puts in the copy's file: copy (the source's data) or none")
	fs.StringVar(&o.closedProps, "closed-export-props", string(rdssim.ClosedExportShown), "whether a closed export prints its port, NQN and allowed host: shown or hidden")
	fs.StringVar(&o.globalReqs, "global-requests", string(rdssim.GlobalRequestsReject), "how SSH global requests (keepalives) are answered: reject, ignore or close")
	fs.StringVar(&o.valueBreak, "value-break", string(rdssim.ValueBreakWidth), "where a value longer than its line breaks: width or hyphen")
	fs.StringVar(&o.legend, "legend", string(rdssim.LegendUsed), "which flags a listing's legend names: used or all")
	fs.StringVar(&o.allowHostChg, "allow-host-change", string(rdssim.AllowHostChangeKeep), "what an allowed host change does to established connections: keep or drop")
}

// Bounds of --terminal-width and --latency.
const (
	// minTerminalWidth: narrower, a property and its value no longer fit
	// beside the indent of a print detail line; no terminal is that
	// narrow.
	minTerminalWidth = 40
	// maxLatency: a longer delay outlasts every client's command timeout,
	// so no command would ever be answered (a hang fault does that).
	maxLatency = time.Hour
)

// maxSocketPath is the longest path a unix socket binds at: sun_path less
// its terminating NUL.
var maxSocketPath = len(syscall.RawSockaddrUnix{}.Path) - 1

// validate checks the flags before anything is read, written or
// listened on, each error naming its flag.
func (o *options) validate(given map[string]bool) error {
	switch {
	case o.dataDir == "":
		return errors.New("--data-dir is required")
	case o.authorizedKeys == "":
		return errors.New("--authorized-keys is required")
	case o.terminalWidth != -1 && o.terminalWidth < minTerminalWidth:
		return fmt.Errorf("--terminal-width %d: want -1 (no wrapping) or at least %d columns (default %d, as RDS hardware over SSH)", o.terminalWidth, minTerminalWidth, rdssim.DefaultTerminalWidth)
	case o.latency < 0 || o.latency > maxLatency:
		return fmt.Errorf("--latency %s: want 0 to %s (a delay added before every command)", o.latency, maxLatency)
	case len(o.faultControl) > maxSocketPath:
		return fmt.Errorf("--fault-control %s: the path is %d bytes, too long for a unix socket: at most %d bytes", o.faultControl, len(o.faultControl), maxSocketPath)
	}
	_, port, err := net.SplitHostPort(o.listen)
	if err == nil {
		var n int
		if n, err = strconv.Atoi(port); err == nil && (n < 0 || n > 65535) {
			err = fmt.Errorf("port %d is outside 0-65535", n)
		}
	}
	if err != nil {
		return fmt.Errorf("--listen %q: want host:port (port 0: any free one), e.g. 127.0.0.1:2222: %v", o.listen, err)
	}
	if net.ParseIP(o.nvmetAddress) == nil {
		return fmt.Errorf("--nvmet-address %q: want an IP address (the NVMe/TCP port's traddr)", o.nvmetAddress)
	}
	// Flags that only mean something with nvmet exporting.
	if o.nvmeExport == "none" {
		for _, f := range []string{"nvmet-root", "nvmet-address"} {
			if given[f] {
				return fmt.Errorf("--%s needs --nvme-export=nvmet or auto: with none nothing is exported over NVMe/TCP", f)
			}
		}
	}
	return nil
}

// faultControlUsage documents --fault-control's requests (the protocol of
// rdssim.ParseFaultRequest).
const faultControlUsage = `
Fault control (--fault-control=<socket>): one request per line, answered
with one line, "ok[ <details>]" or "error: <why>":

  <kind> [nth=<n>] [match=<text>] [count=<n>|count=all] [delay=<duration>] [output=<text>]
      arm a fault on the nth command (from now; default 1) that contains
      match (default: any), for count matching commands (default 1; all:
      until clear). kind is one of:
        fail              not run; the reply is output (default "failure: simulated failure")
        garbage           run; the reply is output (default: text no parser accepts)
        drop-before-exec  the connection is closed; not run
        drop-after-exec   run, then the connection is closed without a reply
        hang              never run nor answered
        late              held unanswered, then run ("lands") delay after it
                          arrived or at release, whichever is first (no
                          delay: at release), also when its client gave up
                          meanwhile, after the commands that ran in between
      A text with a space, a quote or a backslash is a Go string literal:
        late match="nvme-tcp-export=no] nvme-tcp-export=yes" delay=6s
  release   land every held late command now; "ok released=<n>" once landed
  clear     disarm every fault (held commands stay held)
  status    "ok armed=<n> held=<n>"

Anything else is refused: an unknown kind or key, a key twice or on a kind
it does not apply to (delay: late only; output: fail and garbage only), nth
or count outside 1..1000000, a delay outside (0, 1h], an empty text or one
with a control character, a line over 4096 bytes.
`

// listenFaultControl binds the fault control socket at path with mode
// 0600. A socket left there by a simulator that is gone is replaced; a
// live one, or any other file, is refused.
func listenFaultControl(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--fault-control %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("--fault-control %s: another process serves it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--fault-control: removing the stale socket: %w", err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--fault-control: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("--fault-control: %w", err)
	}
	return l, nil
}

// exporter picks the export backend for --nvme-export.
func (o *options) exporter() (rdssim.Exporter, error) {
	switch o.nvmeExport {
	case "none":
		return nil, nil
	case "auto", "nvmet":
	default:
		return nil, fmt.Errorf("--nvme-export %q: want nvmet, none or auto", o.nvmeExport)
	}
	e, err := rdssim.NewNvmetExporter(rdssim.NvmetConfig{Root: o.nvmetRoot, Address: o.nvmetAddress, Logger: klog.Background()})
	if errors.Is(err, rdssim.ErrNoNvmet) && o.nvmeExport == "auto" {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--nvme-export=%s: %w", o.nvmeExport, err)
	}
	return e, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0) // -h: the usage is printed, as asked
		}
		fmt.Fprintln(os.Stderr, "rds-sim:", err)
		os.Exit(2)
	}
}

// run starts the simulator and serves until ctx is done.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rds-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	o.addFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of rds-sim (docs/flags.md says each flag in full):\n")
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), faultControlUsage)
	}
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.Var(klogFlagValue{klogFlags.Lookup("v")}, "v", "log verbosity (2 logs every command)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintln(stdout, version.Version)
		return nil
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := o.validate(given); err != nil {
		return err
	}
	poolSize, err := rdssim.ParseSize(o.poolSize)
	if err != nil || poolSize <= 0 {
		return fmt.Errorf("--pool-size %q: want a positive size like 100G", o.poolSize)
	}
	copyRate, err := rdssim.ParseSize(o.copyRate)
	if o.copyRate != "0" && (err != nil || copyRate <= 0) {
		return fmt.Errorf("--copy-rate %q: want 0 or a positive size per second like 500M", o.copyRate)
	}
	if o.hostKey == "" {
		o.hostKey = filepath.Join(o.dataDir, ".rdssim-host-key")
	}
	hostChange, err := rdssim.ParseAllowHostChange(o.allowHostChg)
	if err != nil {
		return fmt.Errorf("--allow-host-change: %w", err)
	}
	copyProps, err := rdssim.ParseCopyFromProperties(o.copyFromProps)
	if err != nil {
		return fmt.Errorf("--copy-from-properties: %w", err)
	}
	copyData, err := rdssim.ParseCopyFromData(o.copyFromData)
	if err != nil {
		return fmt.Errorf("--copy-from-data: %w", err)
	}
	closedProps, err := rdssim.ParseClosedExportProps(o.closedProps)
	if err != nil {
		return fmt.Errorf("--closed-export-props: %w", err)
	}
	globalReqs, err := rdssim.ParseGlobalRequests(o.globalReqs)
	if err != nil {
		return fmt.Errorf("--global-requests: %w", err)
	}
	valueBreak, err := rdssim.ParseValueBreak(o.valueBreak)
	if err != nil {
		return fmt.Errorf("--value-break: %w", err)
	}
	legend, err := rdssim.ParseLegend(o.legend)
	if err != nil {
		return fmt.Errorf("--legend: %w", err)
	}
	keys, err := rdssim.LoadAuthorizedKeys(o.authorizedKeys)
	if err != nil {
		return err
	}
	exporter, err := o.exporter()
	if err != nil {
		return err
	}
	srv, err := rdssim.New(rdssim.Config{
		DataDir:             o.dataDir,
		PoolName:            o.poolName,
		PoolSize:            poolSize,
		HostKeyPath:         o.hostKey,
		AuthorizedKeys:      keys,
		Latency:             o.latency,
		CRLF:                o.crlf,
		TerminalWidth:       o.terminalWidth,
		ExitStatusOnFailure: o.exitOnFailure,
		CopyRate:            copyRate,
		Logger:              klog.Background(),
		Exporter:            exporter,
		AllowHostChange:     hostChange,
		CopyFromProperties:  copyProps,
		CopyFromData:        copyData,
		ClosedExportProps:   closedProps,
		GlobalRequests:      globalReqs,
		ValueBreak:          valueBreak,
		Legend:              legend,
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	addr, err := srv.Start(o.listen)
	if err != nil {
		return err
	}
	if o.faultControl != "" {
		l, err := listenFaultControl(o.faultControl)
		if err != nil {
			return err
		}
		served := make(chan struct{})
		go func() {
			defer close(served)
			_ = srv.ServeFaultControl(l)
		}()
		defer func() {
			l.Close() // unlinks the socket, ends its connections
			<-served
		}()
	}
	if o.knownHostsOut != "" {
		if err := srv.WriteKnownHosts(o.knownHostsOut); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "rds-sim listening on %s\n", addr)
	fmt.Fprintf(stdout, "host key %s %s\n", srv.HostPublicKey().Type(), ssh.FingerprintSHA256(srv.HostPublicKey()))
	fmt.Fprintf(stdout, "pool %q: %d bytes in %s\n", o.poolName, poolSize, srv.DataDir())
	if exporter != nil {
		fmt.Fprintf(stdout, "exporting through nvmet (%s) on %s\n", o.nvmetRoot, o.nvmetAddress)
	} else {
		fmt.Fprintln(stdout, "not exporting over NVMe/TCP (no nvmet)")
	}
	fmt.Fprintf(stdout, "a change of a disk's allowed host: %s established connections (--allow-host-change)\n", hostChange)
	fmt.Fprintf(stdout, "a closed export's server properties: %s (--closed-export-props)\n", closedProps)
	if o.faultControl != "" {
		fmt.Fprintf(stdout, "fault control on %s\n", o.faultControl)
	}

	<-ctx.Done()
	fmt.Fprintln(stdout, "rds-sim shutting down")
	return srv.Close()
}

// klogFlagValue exposes klog's -v on our flag set.
type klogFlagValue struct{ f *flag.Flag }

func (v klogFlagValue) String() string {
	if v.f == nil {
		return ""
	}
	return v.f.Value.String()
}

func (v klogFlagValue) Set(s string) error { return v.f.Value.Set(s) }
