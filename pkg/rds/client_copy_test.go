package rds

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// waitForCommand waits until the simulator has received a command
// containing match (it is logged before the exec request is answered).
func waitForCommand(t *testing.T, sim *rdssim.Server, match string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		for _, c := range sim.Commands() {
			if strings.Contains(c.Text, match) {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the simulator never received %q", match)
}

func commandsContaining(sim *rdssim.Server, match string) int {
	n := 0
	for _, c := range sim.Commands() {
		if strings.Contains(c.Text, match) {
			n++
		}
	}
	return n
}

// TestSlowCopyKeepsOtherSessions: a copy that outlives the per-command
// timeout neither drops the shared connection under the commands in flight
// beside it nor is sent twice; it is bounded by the caller's context and
// then reported as not confirmed.
func TestSlowCopyKeepsOtherSessions(t *testing.T) {
	env := startSim(t, 10*GiB)
	c := env.client(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-src", GiB)); err != nil {
		t.Fatal(err)
	}
	env.sim.HangNth(1, "copy-from")

	copyErr := make(chan error, 1)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, err := c.CopyDisk(cctx, CopyDiskRequest{Slot: "snap-1", FilePath: "/storage-pool/k8s/snap-1.img", SourceSlot: "pvc-src"})
		copyErr <- err
	}()
	waitForCommand(t, env.sim, "copy-from")

	// Three reads in flight when the copy is given up.
	env.sim.SetLatency(300 * time.Millisecond)
	before := commandsContaining(env.sim, `where slot="pvc-src"`)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.GetDisk(ctx, "pvc-src")
		}()
	}
	for commandsContaining(env.sim, `where slot="pvc-src"`) < before+len(errs) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("GetDisk %d beside the slow copy: %v", i, err)
		}
	}
	if err := <-copyErr; err == nil {
		t.Fatal("the hung copy succeeded")
	}
	if n := commandsContaining(env.sim, "copy-from"); n != 1 {
		t.Errorf("the copy was sent %d times", n)
	}
	if c.Dials() != 1 {
		t.Errorf("dials = %d, want 1", c.Dials())
	}
}

// TestCopyPendingThenDone: a copy whose reply does not come within the
// caller's context is not re-sent and is reported pending; the disk
// appears when the copy completes, and the copy is then complete. The
// copy is held by the simulator's CopyGate and the caller's deadline
// passes once the copy's file exists: with a copy rate and a fixed
// timeout, a loaded machine could spend the timeout before the copy was
// sent, or the copy's second before the checks of the pending copy.
func TestCopyPendingThenDone(t *testing.T) {
	gate := make(chan struct{})
	env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.CopyGate = gate })
	c := env.client(t, nil)
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-src", 64*MiB)); err != nil {
		t.Fatal(err)
	}
	r := CopyDiskRequest{Slot: "snap-1", FilePath: "/storage-pool/k8s/snap-1.img", SourceSlot: "pvc-src"}
	cctx, expire := rdssim.DeadlineOnCue(ctx)
	answered, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		defer expire()
		file := filepath.Join(env.sim.DataDir(), "k8s", "snap-1.img")
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			select {
			case <-answered:
				return
			default:
			}
			if _, err := os.Stat(file); err == nil {
				return
			}
		}
		t.Errorf("the copy's file %s never appeared", file)
	}()
	_, err := c.CopyDisk(cctx, r)
	close(answered)
	<-watched
	if !errors.Is(err, ErrCopyPending) {
		t.Fatalf("CopyDisk past its context: %v, want ErrCopyPending", err)
	}
	if _, err := c.GetDisk(ctx, "snap-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the copy's disk before the copy completed: %v", err)
	}
	if err := c.RemoveFile(ctx, r.FilePath); !errors.Is(err, ErrCommandFailed) {
		t.Fatalf("removing the file of a running copy: %v", err)
	}
	close(gate)
	deadline := time.Now().Add(time.Minute)
	for len(env.sim.Disks()) != 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	d, err := c.GetDisk(ctx, "snap-1")
	if err != nil || d.Size != 64*MiB {
		t.Fatalf("the copy after it completed: %+v, %v", d, err)
	}
	if n := commandsContaining(env.sim, "copy-from"); n != 1 {
		t.Errorf("the copy was sent %d times", n)
	}
}

// TestCopyNeverInheritsExport: RouterOS's CLI manual says add's copy-from
// takes the new item's default property values from the existing item, so
// a copy of a disk open to one host that does not set every export
// property is open to that host too (a restore handed to the source's
// node). Under both simulator variants (inherit, as the manual describes;
// fresh), and whether a closed export prints its properties or not, every
// copy has exactly the export it asked for and no allowed host: as the
// client reads it, and as the simulator holds it.
func TestCopyNeverInheritsExport(t *testing.T) {
	const hostA = "nqn.2014-08.org.nvmexpress:uuid:0b5ed1f4-5a4c-4a35-9a49-6a3c3e2f0a11"
	for _, v := range []struct {
		props  rdssim.CopyFromProperties
		closed rdssim.ClosedExportProps
	}{
		{rdssim.CopyFromInherit, rdssim.ClosedExportShown}, {rdssim.CopyFromFresh, rdssim.ClosedExportShown},
		{rdssim.CopyFromInherit, rdssim.ClosedExportHidden}, {rdssim.CopyFromFresh, rdssim.ClosedExportHidden},
	} {
		t.Run(string(v.props)+"/closed-"+string(v.closed), func(t *testing.T) {
			env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.CopyFromProperties, c.ClosedExportProps = v.props, v.closed })
			c := env.client(t, nil)
			ctx := context.Background()
			if _, err := c.CreateDisk(ctx, req("pvc-src", 64*MiB)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.SwapExport(ctx, "pvc-src", ExportState{Open: true}, ExportState{Open: true, Host: hostA}); err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				name, slot, source string
				export             *Export
				wantOpen           bool
			}{
				{"snapshot (not exported)", "snap-1", "pvc-src", nil, false},
				{"clone, open to any host", "pvc-clone", "pvc-src", &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-clone"}, true},
				{"restore, closed (storage fencing)", "pvc-restore", "snap-1", &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-restore", Closed: true}, false},
				{"restore, open to any host", "pvc-restore-open", "snap-1", &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-restore-open"}, true},
			} {
				d, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: tc.slot, FilePath: "/storage-pool/k8s/" + tc.slot + ".img", SourceSlot: tc.source, Export: tc.export})
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if d.Exported != tc.wantOpen || d.AllowHost != "" {
					t.Errorf("%s: exported=%v, allowed host %q; want exported=%v to any host (the source is open to %s)", tc.name, d.Exported, d.AllowHost, tc.wantOpen, hostA)
				}
				if tc.export != nil && (d.NQN != tc.export.NQN || d.Port != tc.export.Port) {
					t.Errorf("%s: port %d NQN %q, want %d %q", tc.name, d.Port, d.NQN, tc.export.Port, tc.export.NQN)
				}
				for _, held := range env.sim.Disks() {
					if held.Slot == tc.slot && (held.NVMeTCPExport != tc.wantOpen || held.AllowHostName != "" ||
						tc.export != nil && (held.NVMeTCPNQN != tc.export.NQN || held.NVMeTCPPort != tc.export.Port)) {
						t.Errorf("%s: the RDS holds %+v", tc.name, held)
					}
				}
			}
		})
	}
}

// TestCopyDiskClearsThePassword: under copy-from inherit (as RouterOS's
// manual describes it) a copy takes the source's nvme-tcp-server-password
// with the rest; the copy's export must not (a clone handed to another
// node would need the source's secret, and one open to any host with a
// password is refused by the nvmet backend). Assumed like the password.
func TestCopyDiskClearsThePassword(t *testing.T) {
	env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.CopyFromProperties = rdssim.CopyFromInherit })
	c := env.client(t, nil)
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-src", 64*MiB)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.exec(ctx, "/disk set [find slot=%s] nvme-tcp-server-allow-host-name=%s nvme-tcp-server-password=%s", "pvc-src", "nqn.2014-08.org.nvmexpress:uuid:a", "pw"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: "snap-1", FilePath: "/storage-pool/k8s/snap-1.img", SourceSlot: "pvc-src"}); err != nil {
		t.Fatal(err)
	}
	out, err := c.exec(ctx, "/disk print detail where slot=%s", "snap-1")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "nvme-tcp-server-secret") {
		t.Fatalf("the copy kept the source's password:\n%s", out)
	}
}

// A copy of a disk without a password sends no nvme-tcp-server-password:
// whether RouterOS takes that property on `add` is assumed, and a RouterOS
// that refuses it must not fail every snapshot and clone of a cluster that
// never set a password. A copy of one with a password still clears it
// (TestCopyDiskClearsThePassword).
func TestCopyDiskWithoutPasswordSendsNone(t *testing.T) {
	env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.CopyFromProperties = rdssim.CopyFromInherit })
	c := env.client(t, nil)
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-src", 64*MiB)); err != nil {
		t.Fatal(err)
	}
	env.sim.InjectFault(rdssim.Fault{Kind: rdssim.FaultFail, Match: "nvme-tcp-server-password", Output: "expected end of command (line 1 column 200)"})
	if _, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: "snap-1", FilePath: "/storage-pool/k8s/snap-1.img", SourceSlot: "pvc-src"}); err != nil {
		t.Fatalf("a copy of a disk without a password on a RouterOS that does not take the property on add: %v", err)
	}
}
