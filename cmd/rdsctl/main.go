// Command rdsctl runs the driver's RouterOS operations by hand: the same
// validated commands and parsers the CSI driver uses, for operators checking
// an RDS (or the simulator) and for `make demo`.
package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/srvlab/rds-csi/pkg/rds"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "rdsctl:", err)
		os.Exit(1)
	}
}

const usage = `usage: rdsctl [flags] COMMAND [ARGS]

commands:
  probe                         /system resource print
  capacity                      pool size and free space
  list                          every file-backed disk
  get SLOT                      one disk
  create SLOT SIZE              new exported disk (SIZE like 10G, 1536M, 1073741824);
                                with -closed, exported to no host until 'export SLOT on'
  resize SLOT SIZE              grow a disk
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
  selftest                      create, print, resize, snapshot, restore and delete scratch disks
                                (rdsctl-selftest-*), check every parse, print a report
  gen-key PATH                  write a new ed25519 key pair (PATH, PATH.pub) for the driver's RDS user

flags:
`

func run(args []string) error {
	fs := flag.NewFlagSet("rdsctl", flag.ContinueOnError)
	var (
		cfg       rds.Config
		pool      = fs.String("pool", "storage-pool", "mount point of the storage pool on the RDS")
		basePath  = fs.String("base-path", rds.DefaultVolumePath, "directory of the disks' backing files on the RDS (the driver's --rds-volume-path)")
		nqnPrefix = fs.String("nqn-prefix", "nqn.2000-02.com.mikrotik:", "NQN prefix of exported disks")
		nvmePort  = fs.Int("nvme-port", 4420, "NVMe/TCP port of exported disks")
		show      = fs.Bool("show-commands", false, "print each RouterOS command and what RouterOS returned")
		closed    = fs.Bool("closed", false, "create: set the NVMe/TCP port and NQN but export to no host (storage fencing)")
		keepConns = fs.Bool("keep-connections", false, "export on: when the export moves from another host, set the host only instead of turning the export off and on (established connections may survive)")
		timeout   = fs.Duration("timeout", time.Minute, "overall timeout")
	)
	fs.StringVar(&cfg.Address, "address", "127.0.0.1", "RDS address")
	fs.IntVar(&cfg.Port, "port", 22, "RDS SSH port")
	fs.StringVar(&cfg.User, "user", "admin", "RDS user")
	fs.StringVar(&cfg.LoginOptions, "login-options", rds.DefaultLoginOptions, "RouterOS console login options sent after '+' in the user name; none sends -user unchanged")
	fs.StringVar(&cfg.KeyFile, "key", "", "SSH private key file")
	fs.StringVar(&cfg.KnownHostsFile, "known-hosts", "", "known_hosts file pinning the RDS host key")
	fs.BoolVar(&cfg.InsecureSkipHostKeyCheck, "insecure-skip-host-key-check", false, "accept any host key (labs only)")
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return fmt.Errorf("no command")
	}
	if fs.Arg(0) == "gen-key" {
		if fs.NArg() != 2 {
			return fmt.Errorf("gen-key needs a PATH")
		}
		return genKey(fs.Arg(1))
	}
	if *show {
		cfg.Observer = func(r rds.CommandRecord) {
			fmt.Printf("  > %s\n", r.Command)
			for _, l := range strings.Split(strings.TrimRight(r.Output, "\r\n"), "\n") {
				if l != "" {
					fmt.Printf("  < %s\n", l)
				}
			}
			if r.Err != nil {
				fmt.Printf("  ! %v\n", r.Err)
			}
		}
	}
	if fs.Arg(0) == "selftest" {
		return selftest(cfg, selftestOptions{pool: *pool, basePath: *basePath, nqnPrefix: *nqnPrefix, nvmePort: *nvmePort,
			timeout: *timeout, loginOptions: cfg.LoginOptions}, os.Stdout)
	}
	client, err := rds.NewClient(cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	cmd, rest := fs.Arg(0), fs.Args()[1:]
	need := func(n int) error {
		if len(rest) < n {
			return fmt.Errorf("%s needs %d argument(s); see rdsctl -h", cmd, n)
		}
		return nil
	}
	file := func(slot string) string { return rds.VolumeFilePath(*basePath, slot) }
	switch cmd {
	case "probe":
		info, err := client.Probe(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("RDS %s, RouterOS %s, up %s\n", info.BoardName, info.Version, info.Uptime)
	case "capacity":
		c, err := client.Capacity(ctx, *pool)
		if err != nil {
			return err
		}
		fmt.Printf("pool %s: %d bytes total, %d bytes free\n", *pool, c.Total, c.Free)
	case "list":
		disks, err := client.ListDisks(ctx)
		if err != nil {
			return err
		}
		printDisks(disks...)
	case "get":
		if err := need(1); err != nil {
			return err
		}
		d, err := client.GetDisk(ctx, rest[0])
		if err != nil {
			return err
		}
		printDisks(*d)
	case "create":
		if err := need(2); err != nil {
			return err
		}
		size, err := rds.ParseSize(rest[1])
		if err != nil {
			return fmt.Errorf("size %q: %w", rest[1], err)
		}
		d, err := client.CreateDisk(ctx, rds.CreateDiskRequest{Slot: rest[0], FilePath: file(rest[0]), Size: size,
			Export: &rds.Export{Port: *nvmePort, NQN: *nqnPrefix + rest[0], Closed: *closed}})
		if err != nil {
			return err
		}
		printDisks(*d)
	case "resize":
		if err := need(2); err != nil {
			return err
		}
		size, err := rds.ParseSize(rest[1])
		if err != nil {
			return fmt.Errorf("size %q: %w", rest[1], err)
		}
		d, err := client.ResizeDisk(ctx, rest[0], size)
		if err != nil {
			return err
		}
		printDisks(*d)
	case "copy":
		if err := need(2); err != nil {
			return err
		}
		var size int64
		if len(rest) > 2 {
			if size, err = rds.ParseSize(rest[2]); err != nil {
				return fmt.Errorf("size %q: %w", rest[2], err)
			}
		}
		d, err := client.CopyDisk(ctx, rds.CopyDiskRequest{Slot: rest[0], FilePath: file(rest[0]), SourceSlot: rest[1], Size: size})
		if err != nil {
			return err
		}
		printDisks(*d)
	case "delete":
		if err := need(1); err != nil {
			return err
		}
		// The disk's own file, if it is one of the driver's: a volume
		// (<base>/<slot>.img) or a snapshot (<base>/snapshots/<slot>.*.img).
		d, err := client.GetDisk(ctx, rest[0])
		if err != nil {
			return err
		}
		if rds.FileKind(*basePath, *d) == "" {
			return fmt.Errorf("disk %s uses %s, not a volume or snapshot file under --base-path %s; refusing to delete", d.Slot, d.FilePath, *basePath)
		}
		if err := client.DeleteDisk(ctx, d.Slot, d.FilePath); err != nil {
			return err
		}
		fmt.Printf("deleted %s and %s\n", d.Slot, d.FilePath)
	case "allow-host":
		if err := need(1); err != nil {
			return err
		}
		host := ""
		if len(rest) > 1 {
			host = rest[1]
		}
		if err := client.SetAllowedHost(ctx, rest[0], host); err != nil {
			return err
		}
		fmt.Printf("%s: allowed host %q\n", rest[0], host)
	case "export":
		return exportCommand(ctx, client, rest, !*keepConns)
	default:
		fs.Usage()
		return fmt.Errorf("unknown command %q", cmd)
	}
	return nil
}

func printDisks(disks ...rds.Disk) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
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
func exportCommand(ctx context.Context, client *rds.Client, args []string, drop bool) error {
	if len(args) < 2 || (args[1] != "on" && args[1] != "off") || (args[1] == "on" && len(args) != 3) || len(args) > 3 {
		return fmt.Errorf("usage: export SLOT on HOSTNQN|any, or export SLOT off [HOSTNQN]")
	}
	slot := args[0]
	host := ""
	if len(args) == 3 && args[2] != "any" {
		host = args[2]
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
			fmt.Printf("%s: already exported to %s\n", slot, label)
		case ch.Dropped:
			fmt.Printf("%s: exported to %s; established connections dropped, no host could connect for %v\n", slot, label, ch.Gap)
		case ch.Before.Exported:
			fmt.Printf("%s: exported to %s, was %s; established connections NOT dropped\n", slot, label, allowedLabel(ch.Before.AllowHost))
		default:
			fmt.Printf("%s: exported to %s (was not exported)\n", slot, label)
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
			fmt.Printf("%s: already not exported\n", slot)
			return nil
		}
		return fmt.Errorf("%s is exported to %s, not %s: left open (close it with 'export %s off %s')", slot, allowedLabel(d.AllowHost), label, slot, argHost(d.AllowHost))
	}
	fmt.Printf("%s: export closed (was exported to %s); established connections dropped\n", slot, label)
	return nil
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
func genKey(path string) error {
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
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := pem.Encode(f, block); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(path+".pub", ssh.MarshalAuthorizedKey(sshPub), 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s and %s (%s)\n", path, path+".pub", ssh.FingerprintSHA256(sshPub))
	return nil
}
