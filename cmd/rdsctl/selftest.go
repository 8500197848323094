package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// The self-test runs the driver's whole RouterOS vocabulary on scratch
// disks of its own and reports, besides a line per check, one line per
// RouterOS fact that docs/routeros.md lists (facts table, selftestFacts):
// confirmed, contradicted or skipped, with what was measured.
//
// It must never harm the RDS it tests:
//   - no scratch disk is ever exported to any host: they are created
//     closed (the driver's storage-fencing form) and opened only to host
//     NQNs made up for this run from 128 random bits;
//   - every exit path short of SIGKILL removes what it created: a failed
//     check, the timeout, SIGINT, SIGTERM, SIGHUP or SIGQUIT (a second
//     signal abandons the cleanup and names what is left), its output
//     closed (`| head`: EPIPE, SIGPIPE handled); a copy still running on
//     the RDS is waited for (-copy-wait), since its file cannot be
//     removed before it completes.

// selftestOptions are the rdsctl flags the self-test uses.
type selftestOptions struct {
	pool, basePath, nqnPrefix string
	nvmePort                  int
	timeout                   time.Duration // bounds the checks, not the cleanup
	loginOptions              string
	json                      bool          // -o json
	copyWait                  time.Duration // how long the cleanup waits for a running copy
	data                      dataPath      // nil: the data check is skipped
}

// selftestFlags are the flags only the self-test reads.
type selftestFlags struct {
	output      string
	data        bool
	nvmeAddress string
	copyWait    time.Duration
}

func addSelftestFlags(fs *flag.FlagSet) *selftestFlags {
	f := &selftestFlags{}
	fs.StringVar(&f.output, "o", "text", "selftest: report format, text or json")
	fs.BoolVar(&f.data, "data", false, "selftest: also check over NVMe/TCP that a copy holds its source's data (Linux, root)")
	fs.StringVar(&f.nvmeAddress, "nvme-address", "", "selftest -data: the RDS's NVMe/TCP address (default: -address)")
	fs.DurationVar(&f.copyWait, "copy-wait", time.Hour, "selftest: how long the clean-up waits for a running copy (0: no wait)")
	return f
}

// validate checks the selftest flags before anything is dialled: a bad
// value is a usage error, not a failed self-test.
func (f *selftestFlags) validate() error {
	if f.output != "text" && f.output != "json" {
		return usagef("-o %q: want text or json", f.output)
	}
	if f.copyWait < 0 {
		return usagef("-copy-wait must not be negative, not %v (0: do not wait for a running copy)", f.copyWait)
	}
	return nil
}

// selftestCommand is `rdsctl selftest` with flags that validate has
// passed: it sets up the data path and runs the self-test until it ends
// or a signal stops it.
func selftestCommand(cfg rds.Config, o selftestOptions, f *selftestFlags, out io.Writer) error {
	o.json = f.output == "json"
	o.copyWait = f.copyWait
	if f.data {
		addr := f.nvmeAddress
		if addr == "" {
			addr = cfg.Address
		}
		p, err := newNVMeDataPath(o.nqnPrefix+scratchPrefix, addr, o.nvmePort)
		if err != nil {
			return fmt.Errorf("-data: %w", err)
		}
		o.data = p
	}
	return selftestWithSignals(cfg, o, out)
}

// endSignals end rdsctl unless it handles them (SIGKILL aside, which
// nothing can): the first stops the checks and lets the cleanup run, a
// second one stops the cleanup too.
var endSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT}

// outputWatch passes writes on and tells, once, that one failed: the
// reader of rdsctl's output is gone (`rdsctl selftest | head` after head
// exits: EPIPE), so the checks stop and the cleanup runs.
type outputWatch struct {
	w      io.Writer
	once   sync.Once
	failed chan struct{} // closed at the first failed write
	err    error         // that write's error, set before failed is closed
}

func watchOutput(w io.Writer) *outputWatch {
	if ow, ok := w.(*outputWatch); ok {
		return ow
	}
	return &outputWatch{w: w, failed: make(chan struct{})}
}

func (o *outputWatch) Write(p []byte) (int, error) {
	n, err := o.w.Write(p)
	if err != nil {
		o.once.Do(func() { o.err = err; close(o.failed) })
	}
	return n, err
}

// selftestWithSignals runs the self-test; the first of endSignals, or a
// write to out that fails, stops the checks and lets the cleanup run; a
// second signal stops the cleanup too. SIGPIPE is handled, so a write to
// a closed pipe on stdout fails (and is seen) instead of killing rdsctl
// before it cleans up.
func selftestWithSignals(cfg rds.Config, o selftestOptions, out io.Writer) error {
	w := watchOutput(out)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, endSignals...)
	defer signal.Stop(sigs)
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)
	runCtx, stopRun := context.WithCancelCause(context.Background())
	cleanCtx, stopClean := context.WithCancelCause(context.Background())
	defer stopRun(nil)
	defer stopClean(nil)
	done := make(chan struct{})
	defer close(done)
	go func() {
		failed := w.failed
		for n := 0; n < 2; {
			select {
			case s := <-sigs:
				if n == 0 {
					stopRun(fmt.Errorf("interrupted by %v", s))
				} else {
					stopClean(fmt.Errorf("cleanup abandoned after a second %v", s))
				}
				n++
			case <-failed:
				stopRun(fmt.Errorf("stopped: its output was closed (%v), so nobody reads the report", w.err))
				failed = nil
			case <-pipe:
				// The write that raised it fails: seen above.
			case <-done:
				return
			}
		}
	}()
	return selftest(runCtx, cleanCtx, cfg, o, w)
}

// scratchPrefix starts every scratch disk's slot.
const scratchPrefix = "rdsctl-selftest-"

// transcript records every command of the self-test with its output, for
// the measurements.
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

// last is the latest command containing match.
func (t *transcript) last(match string) (rds.CommandRecord, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(t.records) - 1; i >= 0; i-- {
		if strings.Contains(t.records[i].Command, match) {
			return t.records[i], true
		}
	}
	return rds.CommandRecord{}, false
}

// report is what the self-test found; -o json prints it as it is.
type report struct {
	Target      string        `json:"target"`
	Scratch     string        `json:"scratch"`
	Checks      []checkResult `json:"checks"`
	Facts       []factResult  `json:"facts"`
	Cleanup     []cleanupItem `json:"cleanup"`
	Interrupted string        `json:"interrupted,omitempty"`
	Failed      int           `json:"failedChecks"`
	Commands    int           `json:"commands"`
}

type checkResult struct {
	Name   string `json:"name"`
	Status string `json:"status"` // ok, fail, skip
	Detail string `json:"detail"`
}

type factResult struct {
	ID       string `json:"id"`
	Fact     string `json:"fact"`
	Status   string `json:"status"` // confirmed, contradicted, skipped
	Measured string `json:"measured"`
}

type cleanupItem struct {
	Slot   string `json:"slot"`
	File   string `json:"file"`
	Status string `json:"status"` // removed, left
	Detail string `json:"detail,omitempty"`
}

const (
	confirmed    = "confirmed"
	contradicted = "contradicted"
	skipped      = "skipped"
)

// selftest runs the checks with runCtx (bounded by o.timeout) and then
// the cleanup with cleanCtx (bounded by o.copyWait plus a minute), and
// writes the report. It returns an error when a check failed, the run was
// interrupted, or something could not be removed.
func selftest(runCtx, cleanCtx context.Context, cfg rds.Config, o selftestOptions, out io.Writer) error {
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
	ctx, cancel := context.WithTimeout(runCtx, o.timeout)
	defer cancel()

	suffix, err := randomHex(3)
	if err != nil {
		return err
	}
	scratch := scratchPrefix + time.Now().UTC().Format("20060102-150405") + "-" + suffix
	st := &selftestRun{c: client, o: o, out: out, ctx: ctx, tr: &tr, facts: map[string]factResult{},
		rep: report{Target: fmt.Sprintf("%s:%d as %s", cfg.Address, cfg.Port, cfg.User), Scratch: scratch}}
	if !o.json {
		fmt.Fprintf(out, "rdsctl selftest on %s, scratch disks %s*\n", st.rep.Target, scratch)
		fmt.Fprintf(out, "scratch disks are exported only to host NQNs made up for this run, never to any host\n\n")
	}
	st.runChecks(scratch)
	if cause := context.Cause(runCtx); cause != nil {
		st.rep.Interrupted = cause.Error()
	} else if ctx.Err() != nil {
		st.rep.Interrupted = fmt.Sprintf("the checks ran out of -timeout %v", o.timeout)
	}
	st.cleanup(cleanCtx)
	st.observe()
	st.rep.Commands = len(tr.all())
	return st.finish()
}

// selftestRun is one run's state.
type selftestRun struct {
	c       *rds.Client
	o       selftestOptions
	out     io.Writer
	ctx     context.Context
	tr      *transcript
	rep     report
	facts   map[string]factResult
	created []scratchDisk // in creation order; the cleanup goes backwards
	stopped bool          // a check failed: the rest are skipped
	// closedHidden: a closed disk printed no port, NQN or allowed host.
	closedHidden bool
	pattern      []byte // what the data check wrote
}

type scratchDisk struct{ slot, file string }

func (st *selftestRun) made(slot, file string) {
	st.created = append(st.created, scratchDisk{slot, file})
}

// check runs one step; after a failure or an interruption the later
// steps, which build on it, are skipped.
func (st *selftestRun) check(name string, fn func() (string, error)) bool {
	r := checkResult{Name: name}
	switch {
	case st.stopped:
		r.Status, r.Detail = "skip", "after an earlier failure"
	case st.ctx.Err() != nil:
		r.Status, r.Detail = "skip", "interrupted"
	default:
		detail, err := runCheck(fn)
		if err != nil {
			r.Status, r.Detail = "fail", err.Error()
			st.stopped = true
			st.rep.Failed++
		} else {
			r.Status, r.Detail = "ok", detail
		}
	}
	st.rep.Checks = append(st.rep.Checks, r)
	if !st.o.json {
		label := map[string]string{"ok": "ok  ", "fail": "FAIL", "skip": "SKIP"}[r.Status]
		fmt.Fprintf(st.out, "%s  %-40s %s\n", label, name, r.Detail)
	}
	return r.Status == "ok"
}

// runCheck runs fn; a panic in it fails the check instead of skipping the
// cleanup.
func runCheck(fn func() (string, error)) (detail string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn()
}

// fact records a measurement of one fact of selftestFacts. A later record
// replaces an earlier one only when it says more: a measurement replaces
// a skip, a contradiction a confirmation.
func (st *selftestRun) fact(id, status, format string, args ...any) {
	def, ok := factByID(id)
	if !ok {
		panic("selftest: unknown fact " + id)
	}
	rank := map[string]int{skipped: 0, confirmed: 1, contradicted: 2}
	if old, seen := st.facts[id]; seen && rank[status] <= rank[old.Status] {
		return
	}
	st.facts[id] = factResult{ID: id, Fact: def.fact, Status: status, Measured: fmt.Sprintf(format, args...)}
}

func (st *selftestRun) runChecks(scratch string) {
	c, ctx, o := st.c, st.ctx, st.o
	snap, restore, plain := scratch+"-snap", scratch+"-restore", scratch+"-copy"
	volFile := rds.VolumeFilePath(o.basePath, scratch)
	snapFile := path.Join(o.basePath, rds.SnapshotDir, snap+".src-"+scratch+".t-"+fmt.Sprint(time.Now().UnixNano())+".img")
	restoreFile := rds.VolumeFilePath(o.basePath, restore)
	plainFile := rds.VolumeFilePath(o.basePath, plain)
	hostA, hostB, hostC, tomb := randomHostNQN(), randomHostNQN(), randomHostNQN(), randomHostNQN()
	if hostA == "" || hostB == "" || hostC == "" || tomb == "" {
		st.check("random host NQNs", func() (string, error) { return "", errors.New("the system's random source failed") })
		return
	}

	st.check("probe", func() (string, error) {
		info, err := c.Probe(ctx)
		if err != nil {
			return "", err
		}
		if info.Version == "" || info.BoardName == "" {
			st.fact("resource-print", contradicted, "no version or board-name in %v", info.Raw)
			return "", fmt.Errorf("no version or board-name in %v", info.Raw)
		}
		st.fact("resource-print", confirmed, "version %q, board-name %q", info.Version, info.BoardName)
		return fmt.Sprintf("RouterOS %s on %s", info.Version, info.BoardName), nil
	})
	st.check("capacity", func() (string, error) {
		cp, err := c.Capacity(ctx, o.pool)
		if err != nil {
			return "", err
		}
		if cp.Total <= 0 || cp.Free < 0 || cp.Free > cp.Total {
			st.fact("pool-capacity", contradicted, "total %d, free %d", cp.Total, cp.Free)
			return "", fmt.Errorf("total %d, free %d", cp.Total, cp.Free)
		}
		st.fact("pool-capacity", confirmed, "size=%d free=%d bytes", cp.Total, cp.Free)
		return fmt.Sprintf("pool %s: %d bytes, %d free", o.pool, cp.Total, cp.Free), nil
	})

	// The driver's create under storage fencing: port and NQN, closed.
	const size = 64*rds.MiB + 1 // not a whole MiB: sent as 65M
	nqn := o.nqnPrefix + scratch
	want := rds.Disk{Slot: scratch, Type: "file", FilePath: volFile, Size: 65 * rds.MiB, Port: o.nvmePort, NQN: nqn}
	st.check("create closed (storage fencing's form)", func() (string, error) {
		st.made(scratch, volFile)
		d, err := c.CreateDisk(ctx, rds.CreateDiskRequest{Slot: scratch, FilePath: volFile, Size: size,
			Export: &rds.Export{Port: o.nvmePort, NQN: nqn, Closed: true}})
		if err != nil {
			return "", err
		}
		if d.Size == want.Size {
			st.fact("size-suffix", confirmed, "file-size=65M read back as %d bytes", d.Size)
		} else {
			st.fact("size-suffix", contradicted, "file-size=65M read back as %d bytes", d.Size)
		}
		st.measurePrint(d)
		st.measureClosed(scratch, "after a closed create")
		return sameDisk(d, want, false)
	})
	st.check("print (get)", func() (string, error) {
		d, err := c.GetDisk(ctx, scratch)
		if err != nil {
			return "", err
		}
		return sameDisk(d, want, false)
	})
	st.check("print (list)", func() (string, error) {
		disks, err := c.ListDisks(ctx)
		if err != nil {
			return "", err
		}
		st.measureFlagColumns()
		for i := range disks {
			if disks[i].Slot == scratch {
				return sameDisk(&disks[i], want, false)
			}
		}
		return "", fmt.Errorf("%s not among %d disks", scratch, len(disks))
	})
	st.check("file print", func() (string, error) {
		f, err := c.GetFile(ctx, volFile)
		if err != nil {
			return "", err
		}
		if "/"+f.Name != volFile {
			return "", fmt.Errorf("name %q, want %q", f.Name, strings.TrimPrefix(volFile, "/"))
		}
		return fmt.Sprintf("%s type=%q size=%d", f.Name, f.Type, f.Size), nil
	})
	st.check("clock and file time", func() (string, error) {
		// A copy's leftover file is aged by these two (rds.CopyDiskRequest
		// OwnsFilePath): the scratch file was made moments ago, so its
		// last-modified must read within minutes of the RDS's clock.
		now, err := c.Clock(ctx)
		if err != nil {
			st.fact("clock-file-time", contradicted, "/system clock print: %v", err)
			return "", err
		}
		f, err := c.GetFile(ctx, volFile)
		if err != nil {
			return "", err
		}
		if f.Modified.IsZero() {
			st.fact("clock-file-time", contradicted, "the file's last-modified is not printed or not readable")
			return "", fmt.Errorf("%s: no readable last-modified", volFile)
		}
		age := now.Sub(f.Modified)
		if age < -time.Minute || age > 15*time.Minute {
			st.fact("clock-file-time", contradicted, "clock %s, a file made moments ago last modified %s (%s apart)", now.Format(time.DateTime), f.Modified.Format(time.DateTime), age)
			return "", fmt.Errorf("the RDS's clock and its file times are %s apart", age)
		}
		st.fact("clock-file-time", confirmed, "clock %s, the scratch file last modified %s", now.Format(time.DateTime), f.Modified.Format(time.DateTime))
		return fmt.Sprintf("%s apart", age.Round(time.Second)), nil
	})
	st.check("file remove refused while a disk uses it", func() (string, error) {
		err := c.RemoveFile(ctx, volFile)
		if err == nil {
			st.fact("file-remove-in-use", contradicted, "/file remove of a disk's file succeeded")
			return "", fmt.Errorf("RouterOS removed the file of disk %s", scratch)
		}
		if _, gerr := c.GetFile(ctx, volFile); gerr != nil {
			return "", fmt.Errorf("refused (%v), but the file is gone: %v", err, gerr)
		}
		st.fact("file-remove-in-use", confirmed, "refused: %v", err)
		return "refused, file kept", nil
	})

	// Storage fencing, as the controller does it (SwapExport), only ever
	// to this run's random host NQNs.
	swap := func(name string, from, to rds.ExportState, measure func(*rds.Disk)) {
		st.check(name, func() (string, error) {
			after, err := c.SwapExport(ctx, scratch, from, to)
			if err != nil {
				return "", err
			}
			d, err := c.GetDisk(ctx, scratch)
			if err != nil {
				return "", err
			}
			if measure != nil {
				measure(d)
			}
			return fmt.Sprintf("%s -> %s", describe(from), describe(after)), nil
		})
	}
	swap("fencing: open to this run's host A", rds.ExportState{}, rds.ExportState{Open: true, Host: hostA}, func(d *rds.Disk) {
		st.fact("find-where-and", confirmed, "[find where slot=... and nvme-tcp-server-allow-host-name=\"\" and nvme-tcp-export=no] matched the closed disk")
		st.fact("set-two-props", confirmed, "one set made it exported=%v with the allowed host read back %s", d.Exported, sameHost(d.AllowHost, hostA))
		if d.Port == o.nvmePort && d.NQN == nqn {
			st.fact("add-closed", confirmed, "opened with port %d and NQN %s as created closed", d.Port, d.NQN)
		} else {
			st.fact("add-closed", contradicted, "opened with port %d NQN %q, created closed with %d %q", d.Port, d.NQN, o.nvmePort, nqn)
		}
	})
	if o.data != nil {
		st.dataWrite(nqn, hostA, hostB)
	}
	swap("fencing: migrate to host B (no drop)", rds.ExportState{Open: true, Host: hostA}, rds.ExportState{Open: true, Host: hostB}, nil)
	swap("fencing: close to a tombstone host", rds.ExportState{Open: true, Host: hostB}, rds.ExportState{Host: tomb}, func(d *rds.Disk) {
		st.measureClosed(scratch, "after a close to a tombstone")
		// Asked with the state as a condition: works whether or not a
		// closed disk prints its allowed host.
		switch held, err := c.ConfirmExport(ctx, scratch, rds.ExportState{Host: tomb}); {
		case err != nil:
			st.fact("allow-host-uuid", skipped, "could not ask: %v", err)
		case held:
			st.fact("allow-host-uuid", confirmed, "a uuid host NQN never seen, set on a closed disk, matches a where-condition on it")
		default:
			st.fact("allow-host-uuid", contradicted, "set a uuid host NQN on a closed disk; a where-condition on it matches nothing (read back %q)", d.AllowHost)
		}
		// The same condition with another host must match nothing, or
		// a print's where does not look at the property.
		switch held, err := c.ConfirmExport(ctx, scratch, rds.ExportState{Host: hostC}); {
		case err != nil:
			st.fact("print-where", skipped, "could not ask: %v", err)
		case held:
			st.fact("print-where", contradicted, "print detail where ... nvme-tcp-server-allow-host-name=<another host> matched the closed disk")
		default:
			st.fact("print-where", confirmed, "on a closed disk, a where-condition on its allowed host matched it and one on another host did not")
		}
	})
	st.check("fencing: a stale condition changes nothing", func() (string, error) {
		before := len(st.tr.all())
		after, err := c.SwapExport(ctx, scratch, rds.ExportState{Open: true, Host: hostA}, rds.ExportState{Open: true, Host: hostC})
		if !errors.Is(err, rds.ErrExportChanged) {
			st.fact("cas-stale", contradicted, "SwapExport from a stale state: %v, state after %s", err, describe(after))
			return "", fmt.Errorf("SwapExport from a stale state: %v (state after: %s), want ErrExportChanged", err, describe(after))
		}
		held, err := c.ConfirmExport(ctx, scratch, rds.ExportState{Host: tomb})
		if err != nil {
			return "", err
		}
		if !held {
			st.fact("cas-stale", contradicted, "the set with a stale condition changed the disk (read back: %s)", describe(after))
			return "", fmt.Errorf("the set with a stale condition changed the disk (read back: %s)", describe(after))
		}
		st.fact("cas-stale", confirmed, "state unchanged (%s), ErrExportChanged", describe(after))
		for _, r := range st.tr.all()[before:] {
			if strings.Contains(r.Command, " set [find where ") {
				if out := strings.TrimSpace(r.Output); out == "" && r.Err == nil {
					st.fact("find-empty", confirmed, "the set matching nothing printed nothing")
				} else {
					st.fact("find-empty", contradicted, "the set matching nothing answered %q, %v (the client takes it for no match either way)", out, r.Err)
				}
			}
		}
		return "nothing changed, ErrExportChanged", nil
	})
	// rdsctl export's multi-step sequences (SetExportHost, CloseExport).
	st.check("rdsctl export: reopen to host B", func() (string, error) {
		ch, err := c.SetExportHost(ctx, scratch, hostB, true)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("changed=%v dropped=%v gap %v", ch.Changed, ch.Dropped, ch.Gap), exportedTo(ctx, c, scratch, true, hostB)
	})
	st.check("rdsctl export: close for another host", func() (string, error) {
		changed, err := c.CloseExport(ctx, scratch, hostA)
		if err != nil || changed {
			return "", fmt.Errorf("changed=%v, %v; want the export left alone", changed, err)
		}
		return "left open to its host, nothing sent", exportedTo(ctx, c, scratch, true, hostB)
	})
	st.check("rdsctl export: close", func() (string, error) {
		changed, err := c.CloseExport(ctx, scratch, hostB)
		if err != nil || !changed {
			return "", fmt.Errorf("changed=%v, %v", changed, err)
		}
		return "export off, allowed host cleared", exportedTo(ctx, c, scratch, false, "")
	})
	st.check("resize", func() (string, error) {
		d, err := c.ResizeDisk(ctx, scratch, 128*rds.MiB)
		if err != nil {
			return "", err
		}
		want.Size = 128 * rds.MiB
		st.fact("resize-grow", confirmed, "file-size=128M read back as %d bytes", d.Size)
		return sameDisk(d, want, false)
	})

	// Copies, each with every export property set (the driver's forms).
	st.check("snapshot (copy, closed, own NQN)", func() (string, error) {
		st.made(snap, snapFile)
		start := time.Now()
		d, err := c.CopyDisk(ctx, rds.CopyDiskRequest{Slot: snap, FilePath: snapFile, SourceSlot: scratch,
			Export: &rds.Export{Port: o.nvmePort, NQN: o.nqnPrefix + snap, Closed: true}})
		if err != nil {
			return "", err
		}
		st.fact("copy-complete", confirmed, "the copy's disk was listed as soon as its add returned (%v)", time.Since(start).Round(time.Millisecond))
		return sameDisk(d, rds.Disk{Slot: snap, Type: "file", FilePath: snapFile, Size: 128 * rds.MiB, Port: o.nvmePort, NQN: o.nqnPrefix + snap}, true)
	})
	st.check("copy without export properties", func() (string, error) {
		st.made(plain, plainFile)
		d, err := c.CopyDisk(ctx, rds.CopyDiskRequest{Slot: plain, FilePath: plainFile, SourceSlot: scratch})
		if err != nil {
			return "", err
		}
		if d.Exported || d.AllowHost != "" {
			return "", fmt.Errorf("the copy is %s, want not exported with no allowed host", describe(rds.StateOf(d)))
		}
		switch {
		case d.NQN == nqn:
			st.fact("copy-inherits", confirmed, "a copy that sets no NQN has its source's, %s", d.NQN)
		case d.NQN == "" && d.Port == 0 && st.closedHidden:
			st.fact("copy-inherits", skipped, "a closed disk prints no port or NQN here, so what the copy took cannot be read")
		default:
			st.fact("copy-inherits", contradicted, "a copy that sets no NQN has %q, its source %q", d.NQN, nqn)
		}
		return fmt.Sprintf("not exported; port %d NQN %q", d.Port, d.NQN), nil
	})
	st.check("find file by prefix (where name~)", func() (string, error) {
		files, err := c.FilesWithPrefix(ctx, path.Join(o.basePath, rds.SnapshotDir, snap)+".src-")
		if err != nil {
			return "", err
		}
		if len(files) != 1 || "/"+files[0].Name != snapFile {
			st.fact("file-regex", contradicted, "found %v, want only %s", files, snapFile)
			return "", fmt.Errorf("found %v, want only %s", files, snapFile)
		}
		st.fact("file-regex", confirmed, "where name~\"^...\" found the %d-character name", len(snapFile))
		return fmt.Sprintf("%d-character name found", len(snapFile)), nil
	})
	restoreNQN := o.nqnPrefix + restore
	st.check("restore (copy of the snapshot, closed, grown)", func() (string, error) {
		st.made(restore, restoreFile)
		r := rds.Disk{Slot: restore, Type: "file", FilePath: restoreFile, Size: 256 * rds.MiB, Port: o.nvmePort, NQN: restoreNQN}
		d, err := c.CopyDisk(ctx, rds.CopyDiskRequest{Slot: restore, FilePath: restoreFile, SourceSlot: snap, Size: 256 * rds.MiB,
			Export: &rds.Export{Port: o.nvmePort, NQN: restoreNQN, Closed: true}})
		if err != nil {
			return "", err
		}
		return sameDisk(d, r, false)
	})
	st.check("restore: open to host A, list beside closed disks", func() (string, error) {
		if _, err := c.SwapExport(ctx, restore, rds.ExportState{}, rds.ExportState{Open: true, Host: hostA}); err != nil {
			return "", err
		}
		disks, err := c.ListDisks(ctx)
		if err != nil {
			return "", err
		}
		st.measureFlagColumns()
		return fmt.Sprintf("opened; %d disks listed", len(disks)), nil
	})
	st.check("errors: missing disk", func() (string, error) {
		_, err := c.GetDisk(ctx, scratch+"-missing")
		if !errors.Is(err, rds.ErrNotFound) {
			return "", fmt.Errorf("got %v, want not found", err)
		}
		if r, ok := st.tr.last("where slot=\"" + scratch + "-missing\""); ok {
			if out := strings.TrimSpace(r.Output); out == "" {
				st.fact("legend-empty", contradicted, "a print matching nothing printed nothing (tolerated)")
			} else if strings.HasPrefix(out, "Flags:") && !strings.Contains(out, "slot=") {
				st.fact("legend-empty", confirmed, "printed the legend alone (%d characters)", len(out))
			} else {
				st.fact("legend-empty", contradicted, "printed %q", truncateText(out))
			}
		}
		_, err = c.CopyDisk(ctx, rds.CopyDiskRequest{Slot: scratch + "-x", FilePath: rds.VolumeFilePath(o.basePath, scratch+"-x"), SourceSlot: scratch + "-missing"})
		if !errors.Is(err, rds.ErrNotFound) {
			return "", fmt.Errorf("copy of a missing disk: %v, want not found", err)
		}
		return "not found, as expected", nil
	})
	// The source and the snapshot go first: the restore is then read
	// without them (copies are independent).
	for _, del := range []scratchDisk{{scratch, volFile}, {snap, snapFile}, {plain, plainFile}} {
		st.check("delete "+del.slot, func() (string, error) {
			if err := c.DeleteDisk(ctx, del.slot, del.file); err != nil {
				return "", err
			}
			if _, err := c.GetDisk(ctx, del.slot); !errors.Is(err, rds.ErrNotFound) {
				return "", fmt.Errorf("disk still there: %v", err)
			}
			if _, err := c.GetFile(ctx, del.file); !errors.Is(err, rds.ErrNotFound) {
				return "", fmt.Errorf("file still there: %v", err)
			}
			return "disk and file gone", nil
		})
	}
	if o.data != nil {
		st.dataCompare(restoreNQN, hostA)
	}
	restoreAt, withPassword := st.passwordChecks(restore, restoreNQN, rds.ExportState{Open: true, Host: hostA}, hostC)
	st.check("restore: close to a tombstone host", func() (string, error) {
		if withPassword {
			// The password goes with the host it was set for.
			after, _, err := c.SwapExportAuth(ctx, restore, restoreAt, rds.ExportState{Host: tomb}, rds.ExportPassword{})
			return describe(after) + ", password cleared", err
		}
		after, err := c.SwapExport(ctx, restore, restoreAt, rds.ExportState{Host: tomb})
		return describe(after), err
	})
	st.check("delete "+restore, func() (string, error) {
		if err := c.DeleteDisk(ctx, restore, restoreFile); err != nil {
			return "", err
		}
		return "disk and file gone", nil
	})
}

// exportedTo reads slot back and compares its export.
func exportedTo(ctx context.Context, c *rds.Client, slot string, exported bool, host string) error {
	d, err := c.GetDisk(ctx, slot)
	if err != nil {
		return err
	}
	if d.Exported != exported || d.AllowHost != host {
		return fmt.Errorf("read back: exported=%v allow-host=%q, want exported=%v allow-host=%q", d.Exported, d.AllowHost, exported, host)
	}
	return nil
}

// finish completes the facts (every one of selftestFacts gets a line),
// writes the report and returns the run's error.
func (st *selftestRun) finish() error {
	conf, contra, skip := 0, 0, 0
	for _, def := range selftestFacts {
		f, ok := st.facts[def.id]
		if !ok {
			why := def.unmeasured
			if why == "" {
				why = "not reached"
				if st.stopped {
					why = "not reached: a check failed first"
				} else if st.rep.Interrupted != "" {
					why = "not reached: " + st.rep.Interrupted
				}
			}
			f = factResult{ID: def.id, Fact: def.fact, Status: skipped, Measured: why}
		}
		switch f.Status {
		case confirmed:
			conf++
		case contradicted:
			contra++
		default:
			skip++
		}
		st.rep.Facts = append(st.rep.Facts, f)
	}
	left := 0
	for _, c := range st.rep.Cleanup {
		if c.Status != "removed" {
			left++
		}
	}
	var err error
	switch {
	case st.rep.Interrupted != "":
		err = fmt.Errorf("selftest %s", st.rep.Interrupted)
	case st.rep.Failed > 0:
		err = fmt.Errorf("selftest: %d of %d checks failed", st.rep.Failed, len(st.rep.Checks))
	}
	if left > 0 {
		err = errors.Join(err, fmt.Errorf("selftest: %d scratch disks or files left on the RDS (listed in the report)", left))
	}
	if st.o.json {
		enc := json.NewEncoder(st.out)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(st.rep); jerr != nil {
			return errors.Join(err, jerr)
		}
		return err
	}
	fmt.Fprintf(st.out, "\nfacts (docs/routeros.md, \"Facts the driver relies on\"):\n")
	for _, f := range st.rep.Facts {
		fmt.Fprintf(st.out, "  %-13s %-26s %s\n", f.Status, f.ID, f.Measured)
	}
	fmt.Fprintln(st.out)
	for _, c := range st.rep.Cleanup {
		if c.Status == "removed" {
			fmt.Fprintf(st.out, "cleanup: removed %s\n", c.Slot)
		} else {
			fmt.Fprintf(st.out, "cleanup: LEFT %s (file %s): %s; remove it by hand: /disk remove [find slot=%q]; /file remove [find name=%q]\n",
				c.Slot, c.File, c.Detail, c.Slot, strings.TrimPrefix(c.File, "/"))
		}
	}
	if st.rep.Interrupted != "" {
		fmt.Fprintf(st.out, "%s\n", st.rep.Interrupted)
	}
	fmt.Fprintf(st.out, "%d checks, %d failed; facts: %d confirmed, %d contradicted, %d skipped; %d commands (-show-commands prints them)\n",
		len(st.rep.Checks), st.rep.Failed, conf, contra, skip, st.rep.Commands)
	return err
}

// cleanup removes every scratch disk and file the run made and did not
// delete, newest first. A copy still running on the RDS has a file but no
// disk yet, and its file cannot be removed: it is waited for (polling,
// up to o.copyWait) and then removed. ctx is cancelled by a second
// signal.
func (st *selftestRun) cleanup(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, st.o.copyWait+time.Minute)
	defer cancel()
	for i := len(st.created) - 1; i >= 0; i-- {
		sd := st.created[i]
		item := cleanupItem{Slot: sd.slot, File: sd.file, Status: "removed"}
		if err := st.remove(ctx, sd); err != nil {
			item.Status, item.Detail = "left", err.Error()
			if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.DeadlineExceeded) {
				item.Detail = cause.Error() + ": " + item.Detail
			}
		}
		st.rep.Cleanup = append(st.rep.Cleanup, item)
	}
}

// remove deletes one scratch disk and its file. A file without a disk
// that cannot be removed is taken for a copy still running (its disk
// appears when it completes): it is waited for, polling, up to
// o.copyWait. Anything else that fails is reported at once.
func (st *selftestRun) remove(ctx context.Context, sd scratchDisk) error {
	deadline := time.Now().Add(st.o.copyWait)
	told := false
	for {
		d, err := st.c.GetDisk(ctx, sd.slot)
		switch {
		case err == nil && d.FilePath != sd.file:
			return fmt.Errorf("slot %s holds a disk on %s, not this run's %s: not removed", sd.slot, d.FilePath, sd.file)
		case err == nil:
			if d.Exported {
				// Closed first (to the host it had: no host is widened),
				// in case RouterOS refuses to remove an exported disk.
				if _, cerr := st.c.SwapExport(ctx, sd.slot, rds.StateOf(d), rds.ExportState{Host: d.AllowHost}); cerr != nil {
					klog.FromContext(ctx).V(2).Info("selftest cleanup: closing the export before removing the disk", "slot", sd.slot, "err", cerr)
				}
			}
			return st.c.DeleteDisk(ctx, sd.slot, sd.file)
		case !errors.Is(err, rds.ErrNotFound):
			return err
		}
		_, err = st.c.GetFile(ctx, sd.file)
		switch {
		case errors.Is(err, rds.ErrNotFound):
			return nil // never made, or gone
		case err != nil:
			return err
		}
		rerr := st.c.RemoveFile(ctx, sd.file)
		if rerr == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("%w (waited %v for a copy to complete, -copy-wait)", rerr, st.o.copyWait)
		}
		if !told && !st.o.json {
			fmt.Fprintf(st.out, "cleanup: %s has a file but no disk, and the file cannot be removed (%v): a copy may still be running on the RDS; waiting up to %v (-copy-wait; a second Ctrl-C gives up)\n", sd.slot, rerr, st.o.copyWait)
		}
		told = true
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return rerr
		case <-t.C:
		}
	}
}

// sameDisk compares what the RDS reported with what was asked for; the
// flags and the allowed host (checked by the fencing steps), and a closed
// export's port and NQN, which a closed disk may not print, are not.
func sameDisk(got *rds.Disk, want rds.Disk, closedMayHide bool) (string, error) {
	g := *got
	g.Flags, g.AllowHost, g.AllowHostUnknown = "", "", false
	if closedMayHide && !g.Exported && g.Port == 0 && g.NQN == "" {
		g.Port, g.NQN = want.Port, want.NQN
	}
	if !want.Exported && !g.Exported && g.Port == 0 && g.NQN == "" {
		g.Port, g.NQN = want.Port, want.NQN
	}
	if g != want {
		return "", fmt.Errorf("got %+v, want %+v", g, want)
	}
	return fmt.Sprintf("%s %d bytes, file %s", got.Slot, got.Size, got.FilePath), nil
}

func describe(s rds.ExportState) string {
	if s.Host != "" {
		// Scratch hosts are random and mean nothing to the reader.
		return strings.Replace(s.String(), s.Host, "a host of this run", 1)
	}
	return s.String()
}

func sameHost(got, want string) string {
	if got == want {
		return "as set"
	}
	return fmt.Sprintf("as %q", got)
}

// randomHostNQN is a uuid-form host NQN from 122 random bits (version 4),
// known to nobody else: the only hosts scratch disks are exported to.
func randomHostNQN() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return ""
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func truncateText(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}
