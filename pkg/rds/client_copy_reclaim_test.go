package rds

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// TestCopyReclaimsItsLeftoverFileOnceQuiet: a copy (clone, restore) whose
// /disk add reply could not be read and whose clean-up then failed to
// remove the file leaves the backing file without a disk, which made every
// later copy of that disk fail "file already exists". With OwnsFilePath
// (the path follows from the slot), the leftover is removed and the copy
// sent again, as a create does, but only once the RDS's own clock says the
// file has not changed for longer than any copy can still land
// (CopyTimeout and an hour for a clock change): a copy whose reply was
// lost may still be writing it, its disk not listed yet. Until then the
// copy is ErrCopyPending (retried), never "already exists", and no
// /file remove is sent. A file a disk uses is never removed.
func TestCopyReclaimsItsLeftoverFileOnceQuiet(t *testing.T) {
	var ahead atomic.Int64 // how far the RDS's clock is moved on
	env := startSimWith(t, 10*GiB, func(c *rdssim.Config) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	})
	c := env.client(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-src", 8*MiB)); err != nil {
		t.Fatal(err)
	}
	srcFile, err := env.sim.BackingFile("pvc-src")
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("source data "), 4096)
	if err := os.WriteFile(srcFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(srcFile, 8*MiB); err != nil {
		t.Fatal(err)
	}
	clone := CopyDiskRequest{Slot: "pvc-clone", FilePath: "/storage-pool/k8s/pvc-clone.img", SourceSlot: "pvc-src",
		Export: &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-clone"}, OwnsFilePath: true}

	// The copy runs, its reply cannot be read, and the clean-up removes
	// the disk but fails to remove the file.
	env.sim.GarbageNth(1, "copy-from")
	env.sim.FailNth(1, "/file remove", "failure: could not remove file")
	if _, err := c.CopyDisk(ctx, clone); err == nil {
		t.Fatal("the copy with an unreadable reply succeeded")
	}
	if _, err := c.GetDisk(ctx, clone.Slot); !errors.Is(err, ErrNotFound) || !env.fileExists(t, clone.FilePath) {
		t.Fatalf("setup: want the copy's file without a disk; disk: %v, file there: %t", err, env.fileExists(t, clone.FilePath))
	}

	removes := func() int { return commandsContaining(env.sim, "/file remove") }
	before := removes()
	_, err = c.CopyDisk(ctx, clone)
	if !errors.Is(err, ErrCopyPending) || errors.Is(err, ErrAlreadyExists) {
		t.Errorf("copy over a fresh leftover: %v; want ErrCopyPending (it may be a copy still running)", err)
	}
	notOwned := clone
	notOwned.OwnsFilePath = false
	if _, err := c.CopyDisk(ctx, notOwned); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("copy without owning the path: %v; want ErrAlreadyExists", err)
	}
	if removes() != before || !env.fileExists(t, clone.FilePath) {
		t.Fatalf("a fresh leftover was removed (%d /file remove sent)", removes()-before)
	}

	// Quiet for longer than a copy can land: debris, reclaimed.
	ahead.Store(int64(c.cfg.CopyTimeout + clockChangeMargin + time.Minute))
	d, err := c.CopyDisk(ctx, clone)
	if err != nil {
		t.Fatalf("copy over a leftover quiet for over two hours: %v; want it removed and the copy made", err)
	}
	if d.FilePath != clone.FilePath || d.Size != 8*MiB || d.NQN != clone.Export.NQN {
		t.Errorf("copied: %+v", *d)
	}
	cloneFile, err := env.sim.BackingFile(clone.Slot)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(cloneFile); err != nil || !bytes.HasPrefix(got, data) {
		t.Errorf("the copy made after the reclaim does not hold the source's data (%v)", err)
	}

	// A file a disk uses is never removed, however old.
	other := req("pvc-other", GiB)
	other.FilePath = "/storage-pool/k8s/pvc-clone2.img"
	if _, err := c.CreateDisk(ctx, other); err != nil {
		t.Fatal(err)
	}
	clone2 := clone
	clone2.Slot, clone2.FilePath = "pvc-clone2", other.FilePath
	clone2.Export = &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-clone2"}
	ahead.Add(int64(24 * time.Hour))
	if _, err := c.CopyDisk(ctx, clone2); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("copy onto a file another disk uses: %v; want ErrAlreadyExists", err)
	}
	if got, err := c.GetDisk(ctx, "pvc-other"); err != nil || got.FilePath != other.FilePath {
		t.Errorf("the disk on the file: %+v, %v", got, err)
	}
}

// TestCopyNeverReclaimsARunningCopysFile: a copy whose reply was lost
// while it still runs (held by the simulator's CopyGate: its file is
// there, its disk not listed yet) is not taken for debris by the copy's
// retry: the retry is ErrCopyPending and sends no /file remove; once the
// copy lands, the retry finds its disk.
func TestCopyNeverReclaimsARunningCopysFile(t *testing.T) {
	gate := make(chan struct{})
	env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.CopyGate = gate })
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	c := env.client(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-src", 8*MiB)); err != nil {
		t.Fatal(err)
	}
	clone := CopyDiskRequest{Slot: "pvc-clone", FilePath: "/storage-pool/k8s/pvc-clone.img", SourceSlot: "pvc-src",
		Export: &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-clone"}, OwnsFilePath: true}

	cctx, cancel := context.WithCancel(ctx)
	first := make(chan error, 1)
	go func() { _, err := c.CopyDisk(cctx, clone); first <- err }()
	waitForCommand(t, env.sim, "copy-from")
	cancel() // the reply is lost: the client stops waiting, the copy runs on
	if err := <-first; !errors.Is(err, ErrCopyPending) {
		t.Fatalf("the copy whose wait was given up: %v; want ErrCopyPending", err)
	}
	before := commandsContaining(env.sim, "/file remove")
	if _, err := c.CopyDisk(ctx, clone); !errors.Is(err, ErrCopyPending) {
		t.Errorf("retry while the copy runs: %v; want ErrCopyPending", err)
	}
	if n := commandsContaining(env.sim, "/file remove") - before; n != 0 {
		t.Errorf("the retry sent %d /file remove for a running copy's file", n)
	}
	close(gate)
	// The held copy lands (its disk appears) once released; the retry
	// then finds it.
	var d *Disk
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if d, _ = c.GetDisk(ctx, clone.Slot); d != nil {
			break
		}
	}
	if d == nil {
		t.Fatal("the released copy never landed")
	}
	if got, err := c.CopyDisk(ctx, clone); err != nil || got.FilePath != clone.FilePath {
		t.Errorf("retry after the copy landed: %+v, %v", got, err)
	}
}

// TestCopyLeftoverWithTheRDSClockSetBack: when the RDS's clock reads
// earlier than the leftover file's last-modified (the clock was set back
// after the file was written), its age says nothing. The file is kept and
// the copy is pending, as for a young file, and the error says why in
// words an operator can act on, not as a negative age.
func TestCopyLeftoverWithTheRDSClockSetBack(t *testing.T) {
	var ahead atomic.Int64
	env := startSimWith(t, 10*GiB, func(c *rdssim.Config) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	})
	c := env.client(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-src", 8*MiB)); err != nil {
		t.Fatal(err)
	}
	clone := CopyDiskRequest{Slot: "pvc-clone", FilePath: "/storage-pool/k8s/pvc-clone.img", SourceSlot: "pvc-src",
		Export: &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-clone"}, OwnsFilePath: true}
	env.sim.GarbageNth(1, "copy-from")
	env.sim.FailNth(1, "/file remove", "failure: could not remove file")
	if _, err := c.CopyDisk(ctx, clone); err == nil {
		t.Fatal("the copy with an unreadable reply succeeded")
	}
	ahead.Store(int64(-30 * 24 * time.Hour)) // the clock set back a month
	before := commandsContaining(env.sim, "/file remove")
	_, err := c.CopyDisk(ctx, clone)
	if !errors.Is(err, ErrCopyPending) {
		t.Errorf("copy over a leftover newer than the RDS's clock: %v; want ErrCopyPending", err)
	}
	if err != nil && (!strings.Contains(err.Error(), "reads earlier than the file's last-modified") || strings.Contains(err.Error(), " -")) {
		t.Errorf("the error does not say the RDS's clock is behind the file's time: %v", err)
	}
	if n := commandsContaining(env.sim, "/file remove") - before; n != 0 || !env.fileExists(t, clone.FilePath) {
		t.Errorf("%d /file remove sent for a leftover whose age cannot be told", n)
	}
}
