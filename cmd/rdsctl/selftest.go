package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// selftestOptions are the rdsctl flags the self-test uses.
type selftestOptions struct {
	pool, basePath, nqnPrefix string
	nvmePort                  int
	timeout                   time.Duration
	loginOptions              string
}

// transcript records every command of the self-test with its output, for
// the checks on RouterOS' behaviour and for the report.
type transcript struct {
	mu      sync.Mutex
	records []rds.CommandRecord
}

func (t *transcript) add(r rds.CommandRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.records = append(t.records, r)
}

func (t *transcript) all() []rds.CommandRecord {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]rds.CommandRecord(nil), t.records...)
}

// selftest runs the driver's whole RouterOS vocabulary against an RDS on a
// scratch disk of its own (created, printed, resized, snapshotted,
// restored, deleted), checks every answer the client parsed, and writes a
// report: one line per check, then what it saw of the behaviour that
// docs/routeros.md marks as assumed. It removes what it created, also after
// a failed check. It returns an error when any check failed.
func selftest(cfg rds.Config, o selftestOptions, out io.Writer) error {
	var tr transcript
	prev := cfg.Observer
	cfg.Observer = func(r rds.CommandRecord) {
		tr.add(r)
		if prev != nil {
			prev(r)
		}
	}
	client, err := rds.NewClient(cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()

	st := &selftestRun{c: client, o: o, out: out, ctx: ctx}
	stamp := time.Now().UTC().Format("20060102-150405")
	scratch := "rdsctl-selftest-" + stamp
	snap := scratch + "-snap"
	restore := scratch + "-restore"
	snapFile := path.Join(o.basePath, rds.SnapshotDir, snap+".src-"+scratch+".t-"+fmt.Sprint(time.Now().UnixNano())+".img")
	defer st.cleanup(map[string]string{
		restore: rds.VolumeFilePath(o.basePath, restore),
		snap:    snapFile,
		scratch: rds.VolumeFilePath(o.basePath, scratch),
	})

	fmt.Fprintf(out, "rdsctl selftest on %s:%d as %s, scratch disks %s*\n\n", cfg.Address, cfg.Port, cfg.User, scratch)
	st.check("probe", func() (string, error) {
		info, err := client.Probe(ctx)
		if err != nil {
			return "", err
		}
		if info.Version == "" || info.BoardName == "" {
			return "", fmt.Errorf("no version or board-name in %v", info.Raw)
		}
		return fmt.Sprintf("RouterOS %s on %s", info.Version, info.BoardName), nil
	})
	st.check("capacity", func() (string, error) {
		c, err := client.Capacity(ctx, o.pool)
		if err != nil {
			return "", err
		}
		if c.Total <= 0 || c.Free < 0 || c.Free > c.Total {
			return "", fmt.Errorf("total %d, free %d", c.Total, c.Free)
		}
		return fmt.Sprintf("pool %s: %d bytes, %d free", o.pool, c.Total, c.Free), nil
	})
	const size = 64*rds.MiB + 1 // not a whole MiB: rounded up to 65 MiB
	export := &rds.Export{Port: o.nvmePort, NQN: o.nqnPrefix + scratch}
	want := rds.Disk{Slot: scratch, Type: "file", FilePath: rds.VolumeFilePath(o.basePath, scratch), Size: 65 * rds.MiB,
		Exported: true, Port: o.nvmePort, NQN: export.NQN}
	st.check("create", func() (string, error) {
		d, err := client.CreateDisk(ctx, rds.CreateDiskRequest{Slot: scratch, FilePath: want.FilePath, Size: size, Export: export})
		if err != nil {
			return "", err
		}
		return sameDisk(d, want)
	})
	st.check("print (get)", func() (string, error) {
		d, err := client.GetDisk(ctx, scratch)
		if err != nil {
			return "", err
		}
		return sameDisk(d, want)
	})
	st.check("print (list)", func() (string, error) {
		disks, err := client.ListDisks(ctx)
		if err != nil {
			return "", err
		}
		for i := range disks {
			if disks[i].Slot == scratch {
				return sameDisk(&disks[i], want)
			}
		}
		return "", fmt.Errorf("%s not among %d disks", scratch, len(disks))
	})
	st.check("file print", func() (string, error) {
		f, err := client.GetFile(ctx, want.FilePath)
		if err != nil {
			return "", err
		}
		if "/"+f.Name != want.FilePath {
			return "", fmt.Errorf("name %q, want %q", f.Name, strings.TrimPrefix(want.FilePath, "/"))
		}
		return fmt.Sprintf("%s type=%q size=%d", f.Name, f.Type, f.Size), nil
	})
	// Storage fencing on the scratch disk, which is open to any host: open
	// it to one host, move it, close it, open it to any host again.
	hostA, hostB := o.nqnPrefix+scratch+"-host-a", o.nqnPrefix+scratch+"-host-b"
	exportedTo := func(exported bool, host string) error {
		d, err := client.GetDisk(ctx, scratch)
		if err != nil {
			return err
		}
		if d.Exported != exported || d.AllowHost != host {
			return fmt.Errorf("read back: exported=%v allow-host=%q, want exported=%v allow-host=%q", d.Exported, d.AllowHost, exported, host)
		}
		return nil
	}
	for _, step := range []struct {
		name, host string
		dropped    bool
	}{
		{"fencing: open to one host", hostA, true},
		{"fencing: move to another host", hostB, true},
	} {
		st.check(step.name, func() (string, error) {
			ch, err := client.SetExportHost(ctx, scratch, step.host, true)
			if err != nil {
				return "", err
			}
			if ch.Dropped != step.dropped {
				return "", fmt.Errorf("dropped=%v, want %v", ch.Dropped, step.dropped)
			}
			if err := exportedTo(true, step.host); err != nil {
				return "", err
			}
			return fmt.Sprintf("export off, host set, on: no host could connect for %v", ch.Gap), nil
		})
	}
	st.check("fencing: close for another host", func() (string, error) {
		changed, err := client.CloseExport(ctx, scratch, hostA)
		if err != nil || changed {
			return "", fmt.Errorf("changed=%v, %v; want the export left alone", changed, err)
		}
		return "left open to its host, nothing sent", exportedTo(true, hostB)
	})
	st.check("fencing: close", func() (string, error) {
		changed, err := client.CloseExport(ctx, scratch, hostB)
		if err != nil || !changed {
			return "", fmt.Errorf("changed=%v, %v", changed, err)
		}
		return "export off, allowed host cleared", exportedTo(false, "")
	})
	st.check("fencing: open to any host", func() (string, error) {
		if _, err := client.SetExportHost(ctx, scratch, "", true); err != nil {
			return "", err
		}
		return "exported to any host again", exportedTo(true, "")
	})
	st.check("resize", func() (string, error) {
		d, err := client.ResizeDisk(ctx, scratch, 128*rds.MiB)
		if err != nil {
			return "", err
		}
		want.Size = 128 * rds.MiB
		return sameDisk(d, want)
	})
	st.check("snapshot (copy)", func() (string, error) {
		d, err := client.CopyDisk(ctx, rds.CopyDiskRequest{Slot: snap, FilePath: snapFile, SourceSlot: scratch})
		if err != nil {
			return "", err
		}
		return sameDisk(d, rds.Disk{Slot: snap, Type: "file", FilePath: snapFile, Size: 128 * rds.MiB, Port: d.Port})
	})
	st.check("find file by prefix (where name~)", func() (string, error) {
		files, err := client.FilesWithPrefix(ctx, path.Join(o.basePath, rds.SnapshotDir, snap)+".src-")
		if err != nil {
			return "", err
		}
		if len(files) != 1 || "/"+files[0].Name != snapFile {
			return "", fmt.Errorf("found %v, want only %s", files, snapFile)
		}
		return fmt.Sprintf("%d-character name found", len(snapFile)), nil
	})
	st.check("restore (copy, grown)", func() (string, error) {
		r := rds.Disk{Slot: restore, Type: "file", FilePath: rds.VolumeFilePath(o.basePath, restore), Size: 256 * rds.MiB,
			Exported: true, Port: o.nvmePort, NQN: o.nqnPrefix + restore}
		d, err := client.CopyDisk(ctx, rds.CopyDiskRequest{Slot: restore, FilePath: r.FilePath, SourceSlot: snap, Size: 256 * rds.MiB,
			Export: &rds.Export{Port: o.nvmePort, NQN: r.NQN}})
		if err != nil {
			return "", err
		}
		return sameDisk(d, r)
	})
	st.check("errors: missing disk", func() (string, error) {
		_, err := client.GetDisk(ctx, scratch+"-missing")
		if !errors.Is(err, rds.ErrNotFound) {
			return "", fmt.Errorf("got %v, want not found", err)
		}
		_, err = client.CopyDisk(ctx, rds.CopyDiskRequest{Slot: scratch + "-x", FilePath: rds.VolumeFilePath(o.basePath, scratch+"-x"), SourceSlot: scratch + "-missing"})
		if !errors.Is(err, rds.ErrNotFound) {
			return "", fmt.Errorf("copy of a missing disk: %v, want not found", err)
		}
		return "not found, as expected", nil
	})
	for _, del := range []struct{ name, slot, file string }{
		{"restored volume", restore, rds.VolumeFilePath(o.basePath, restore)},
		{"snapshot", snap, snapFile},
		{"volume", scratch, want.FilePath},
	} {
		slot, file := del.slot, del.file
		st.check("delete "+del.name, func() (string, error) {
			if err := client.DeleteDisk(ctx, slot, file); err != nil {
				return "", err
			}
			if _, err := client.GetDisk(ctx, slot); !errors.Is(err, rds.ErrNotFound) {
				return "", fmt.Errorf("disk still there: %v", err)
			}
			if _, err := client.GetFile(ctx, file); !errors.Is(err, rds.ErrNotFound) {
				return "", fmt.Errorf("file still there: %v", err)
			}
			st.deleted = append(st.deleted, slot)
			return "disk and file gone", nil
		})
	}
	st.observations(tr.all())
	fmt.Fprintf(out, "\n%d checks, %d failed\n", st.checks, st.failed)
	if st.failed > 0 {
		return fmt.Errorf("selftest: %d of %d checks failed", st.failed, st.checks)
	}
	return nil
}

type selftestRun struct {
	c             *rds.Client
	o             selftestOptions
	out           io.Writer
	ctx           context.Context
	checks        int
	failed        int
	deleted       []string
	stopAtFailure bool
}

// check runs one step; after a failure the later steps, which build on it,
// are skipped.
func (st *selftestRun) check(name string, fn func() (string, error)) {
	st.checks++
	if st.stopAtFailure {
		fmt.Fprintf(st.out, "SKIP  %-36s after an earlier failure\n", name)
		st.failed++
		return
	}
	detail, err := fn()
	if err != nil {
		st.failed++
		st.stopAtFailure = true
		fmt.Fprintf(st.out, "FAIL  %-36s %v\n", name, err)
		return
	}
	fmt.Fprintf(st.out, "ok    %-36s %s\n", name, detail)
}

// cleanup removes the scratch disks the checks did not delete.
func (st *selftestRun) cleanup(files map[string]string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), time.Minute)
	defer cancel()
	for slot, file := range files {
		done := false
		for _, d := range st.deleted {
			done = done || d == slot
		}
		if done {
			continue
		}
		if err := st.c.DeleteDisk(ctx, slot, file); err != nil {
			fmt.Fprintf(st.out, "cleanup: %s: %v (remove it by hand)\n", slot, err)
		}
	}
}

// observations reports what the transcript shows of RouterOS' behaviour
// that docs/routeros.md marks as assumed.
func (st *selftestRun) observations(records []rds.CommandRecord) {
	longest, silent, noisy, copies, fencing := 0, 0, 0, 0, 0
	for _, r := range records {
		if strings.Contains(r.Command, " print") {
			for _, l := range strings.Split(r.Output, "\n") {
				longest = max(longest, len(strings.TrimRight(l, "\r")))
			}
			continue
		}
		if strings.Contains(r.Command, "copy-from") {
			copies++
		}
		if strings.Contains(r.Command, "[find where slot=") && r.Err == nil {
			fencing++
		}
		if r.Err == nil {
			if strings.TrimSpace(r.Output) == "" {
				silent++
			} else {
				noisy++
			}
		}
	}
	fmt.Fprintf(st.out, "\nobserved (compare with the **assumed** lines of docs/routeros.md):\n")
	fmt.Fprintf(st.out, "  longest print line: %d columns (login options %q; over 80 means the width option was honoured)\n", longest, st.o.loginOptions)
	fmt.Fprintf(st.out, "  successful add/set/remove commands that printed nothing: %d, that printed something: %d\n", silent, noisy)
	fmt.Fprintf(st.out, "  copies (/disk add copy-from) run: %d; each returned with its disk listed at once\n", copies)
	fmt.Fprintf(st.out, "  conditional sets ([find where slot=... and nvme-tcp-server-allow-host-name=... and nvme-tcp-export=...]) accepted: %d\n", fencing)
	fmt.Fprintf(st.out, "  NOT checked here: what a host change or export off does to established NVMe/TCP connections (needs a connected host)\n")
	fmt.Fprintf(st.out, "  commands: %d; rerun with -show-commands for the full transcript\n", len(records))
}

// sameDisk compares what the RDS reported with what was asked for.
func sameDisk(got *rds.Disk, want rds.Disk) (string, error) {
	g := *got
	g.Flags, g.AllowHost = "", ""
	if g != want {
		return "", fmt.Errorf("got %+v, want %+v", g, want)
	}
	return fmt.Sprintf("%s %d bytes, file %s", got.Slot, got.Size, got.FilePath), nil
}
