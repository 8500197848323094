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

func TestClientOperationsAgainstSimulator(t *testing.T) {
	env := startSim(t, 100*GiB)
	c := env.client(t, nil)
	ctx := context.Background()

	info, err := c.Probe(ctx)
	if err != nil || info.Version == "" {
		t.Fatalf("Probe = %+v, %v", info, err)
	}

	// 1.5 GiB + 1 byte is rounded up to a whole MiB, never down.
	d, err := c.CreateDisk(ctx, req("pvc-a", 3*GiB/2+1))
	if err != nil {
		t.Fatal(err)
	}
	want := Disk{Slot: "pvc-a", Type: "file", FilePath: "/storage-pool/k8s/pvc-a.img", Size: 3*GiB/2 + MiB,
		Exported: true, Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-a", Flags: d.Flags}
	if *d != want {
		t.Fatalf("created %+v\nwant    %+v", *d, want)
	}
	backing, err := env.sim.BackingFile("pvc-a")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(backing); err != nil || st.Size() != want.Size {
		t.Fatalf("backing file %s: %v, %v", backing, st, err)
	}

	// Same request again: the same disk (a retried create is idempotent).
	if again, err := c.CreateDisk(ctx, req("pvc-a", 3*GiB/2+1)); err != nil || *again != *d {
		t.Fatalf("repeated create = %+v, %v", again, err)
	}
	// Same slot, other size: a conflict, and the disk is untouched.
	if _, err := c.CreateDisk(ctx, req("pvc-a", 5*GiB)); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("conflicting create: %v, want ErrAlreadyExists", err)
	}

	capacity, err := c.Capacity(ctx, "storage-pool")
	if err != nil || capacity.Total != 100*GiB || capacity.Free != 100*GiB-want.Size {
		t.Fatalf("Capacity = %+v, %v", capacity, err)
	}

	if err := os.WriteFile(backing+".probe", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(backing + ".probe")
	f, err := os.OpenFile(backing, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("snapshot me"), 4096); err != nil {
		t.Fatal(err)
	}
	f.Close()

	// Snapshot: a copy of the content, not exported, grown on request.
	snap, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: "snap-a", FilePath: "/storage-pool/k8s/snapshots/snap-a.img", SourceSlot: "pvc-a"})
	if err != nil || snap.Size != want.Size || snap.Exported {
		t.Fatalf("CopyDisk = %+v, %v", snap, err)
	}
	clone, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: "pvc-b", FilePath: "/storage-pool/k8s/pvc-b.img", SourceSlot: "snap-a",
		Size: 2 * GiB, Export: &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-b"}})
	if err != nil || clone.Size != 2*GiB || !clone.Exported {
		t.Fatalf("restore = %+v, %v", clone, err)
	}
	cloneFile, _ := env.sim.BackingFile("pvc-b")
	buf := make([]byte, 11)
	if g, err := os.Open(cloneFile); err != nil {
		t.Fatal(err)
	} else {
		_, err = g.ReadAt(buf, 4096)
		g.Close()
		if err != nil || string(buf) != "snapshot me" {
			t.Fatalf("restored content %q, %v", buf, err)
		}
	}
	if _, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: "pvc-c", FilePath: "/storage-pool/k8s/pvc-c.img", SourceSlot: "pvc-a", Size: GiB}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("copy smaller than source: %v, want ErrInvalidArgument", err)
	}
	if _, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: "pvc-c", FilePath: "/storage-pool/k8s/pvc-c.img", SourceSlot: "pvc-missing"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("copy of missing source: %v, want ErrNotFound", err)
	}

	grown, err := c.ResizeDisk(ctx, "pvc-a", 3*GiB)
	if err != nil || grown.Size != 3*GiB {
		t.Fatalf("ResizeDisk = %+v, %v", grown, err)
	}
	if same, err := c.ResizeDisk(ctx, "pvc-a", GiB); err != nil || same.Size != 3*GiB {
		t.Fatalf("shrinking resize must leave the disk alone: %+v, %v", same, err)
	}
	if _, err := c.ResizeDisk(ctx, "pvc-missing", GiB); !errors.Is(err, ErrNotFound) {
		t.Fatalf("resize of missing disk: %v", err)
	}

	host := "nqn.2014-08.org.nvmexpress:uuid:3f1c2f5e-6a1b-4c3d-9e8f-0123456789ab"
	if err := c.SetAllowedHost(ctx, "pvc-a", host); err != nil {
		t.Fatal(err)
	}
	if d, _ := c.GetDisk(ctx, "pvc-a"); d.AllowHost != host {
		t.Fatalf("allowed host = %q", d.AllowHost)
	}
	if err := c.SetAllowedHost(ctx, "pvc-a", ""); err != nil {
		t.Fatal(err)
	}
	if err := c.SetAllowedHost(ctx, "pvc-missing", host); !errors.Is(err, ErrNotFound) {
		t.Fatalf("allow-host on missing disk: %v", err)
	}

	disks, err := c.ListDisks(ctx)
	if err != nil || len(disks) != 3 || disks[0].Slot != "pvc-a" || disks[1].Slot != "pvc-b" || disks[2].Slot != "snap-a" {
		t.Fatalf("ListDisks = %+v, %v", disks, err)
	}
	if file, err := c.GetFile(ctx, "/storage-pool/k8s/pvc-a.img"); err != nil || file.Name != "storage-pool/k8s/pvc-a.img" {
		t.Fatalf("GetFile = %+v, %v", file, err)
	}

	// Deleting the source leaves the snapshot intact (copies are independent).
	if err := c.DeleteDisk(ctx, "pvc-a", "/storage-pool/k8s/pvc-a.img"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetDisk(ctx, "pvc-a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted disk: %v", err)
	}
	if _, err := c.GetFile(ctx, "/storage-pool/k8s/pvc-a.img"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted disk's file: %v", err)
	}
	if _, err := c.GetDisk(ctx, "snap-a"); err != nil {
		t.Fatalf("snapshot after source delete: %v", err)
	}
	// Deleting again succeeds.
	if err := c.DeleteDisk(ctx, "pvc-a", "/storage-pool/k8s/pvc-a.img"); err != nil {
		t.Fatalf("repeated delete: %v", err)
	}
	if err := c.DeleteDisk(ctx, "pvc-b", "/storage-pool/k8s/other.img"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("delete with the wrong file: %v", err)
	}
	for _, s := range []string{"pvc-b", "snap-a"} {
		d, _ := c.GetDisk(ctx, s)
		if err := c.DeleteDisk(ctx, s, d.FilePath); err != nil {
			t.Fatal(err)
		}
	}
	env.assertNoLeftovers(t)
	if got := c.Dials(); got != 1 {
		t.Errorf("%d SSH connections for one client, want 1 reused", got)
	}
}

func TestDeleteCompletesAfterInterruption(t *testing.T) {
	env := startSim(t, 10*GiB)
	c := env.client(t, func(c *Config) { c.MaxAttempts = 1 })
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-a", GiB)); err != nil {
		t.Fatal(err)
	}
	// The disk is removed, then the file removal fails: the retry finishes it.
	env.sim.FailNth(1, "/file remove", "failure: simulated failure")
	if err := c.DeleteDisk(ctx, "pvc-a", "/storage-pool/k8s/pvc-a.img"); !errors.Is(err, ErrCommandFailed) {
		t.Fatalf("first delete: %v, want ErrCommandFailed", err)
	}
	if err := c.DeleteDisk(ctx, "pvc-a", "/storage-pool/k8s/pvc-a.img"); err != nil {
		t.Fatal(err)
	}
	env.assertNoLeftovers(t)
}

func TestHostKeyPinning(t *testing.T) {
	env := startSim(t, GiB)
	other := startSim(t, GiB)
	ctx := context.Background()

	// known_hosts pins another server's key for this address.
	wrong := filepath.Join(t.TempDir(), "known_hosts")
	if err := other.sim.WriteKnownHosts(wrong, env.sim.Addr()); err != nil {
		t.Fatal(err)
	}
	c := env.client(t, func(c *Config) { c.KnownHostsFile = wrong })
	if _, err := c.Probe(ctx); !errors.Is(err, ErrHostKey) {
		t.Fatalf("mismatched host key: %v, want ErrHostKey", err)
	}
	if len(env.sim.Commands()) != 0 {
		t.Fatal("a command reached a server whose host key did not match")
	}

	// No entry for the address at all is a configuration error up front.
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o600)
	cfg := env.config()
	cfg.KnownHostsFile = empty
	if _, err := NewClient(cfg); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("known_hosts without the host: %v", err)
	}
	cfg.KnownHostsFile = ""
	if _, err := NewClient(cfg); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no known_hosts: %v", err)
	}
	// The insecure lab option connects without one.
	cfg.InsecureSkipHostKeyCheck = true
	insecure, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer insecure.Close()
	if _, err := insecure.Probe(ctx); err != nil {
		t.Fatalf("insecure probe: %v", err)
	}
	// ... but never beside a pinned key, which it would silently override.
	for _, known := range []string{wrong, env.known} {
		cfg.KnownHostsFile = known
		if c, err := NewClient(cfg); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("insecure with a pinned key in %s: %v, %v", known, c, err)
		}
	}

	// A key the RDS does not authorize is refused, and not retried.
	stranger, _, _ := rdssim.NewTestKeys()
	s := env.client(t, func(c *Config) { c.Signer = stranger })
	if _, err := s.Probe(ctx); !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrTransient) {
		t.Fatalf("unauthorized key: %v", err)
	}
}

// TestHostileIDsNeverSent proves that IDs carrying RouterOS or shell syntax
// are rejected before any command leaves the client.
func TestHostileIDsNeverSent(t *testing.T) {
	env := startSim(t, GiB)
	c := env.client(t, nil)
	ctx := context.Background()
	for _, bad := range hostile {
		calls := map[string]error{}
		_, calls["create"] = c.CreateDisk(ctx, req(bad, GiB))
		_, calls["copy source"] = c.CopyDisk(ctx, CopyDiskRequest{Slot: "ok", FilePath: "/storage-pool/ok.img", SourceSlot: bad})
		_, calls["copy"] = c.CopyDisk(ctx, CopyDiskRequest{Slot: bad, FilePath: "/storage-pool/ok.img", SourceSlot: "ok"})
		_, calls["get"] = c.GetDisk(ctx, bad)
		_, calls["resize"] = c.ResizeDisk(ctx, bad, GiB)
		calls["delete"] = c.DeleteDisk(ctx, bad, "/storage-pool/ok.img")
		calls["allow-host"] = c.SetAllowedHost(ctx, bad, "")
		_, calls["export host"] = c.SetExportHost(ctx, bad, "", true)
		_, calls["close export"] = c.CloseExport(ctx, bad, "")
		if strings.ContainsAny(bad, "\"\\$;[]{}'` \t\r\n") {
			// Values with metacharacters are refused in every position.
			_, calls["create path"] = c.CreateDisk(ctx, CreateDiskRequest{Slot: "ok", FilePath: "/storage-pool/" + bad, Size: GiB})
			_, calls["create nqn"] = c.CreateDisk(ctx, CreateDiskRequest{Slot: "ok", FilePath: "/storage-pool/ok.img", Size: GiB, Export: &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:" + bad}})
			calls["allow-host nqn"] = c.SetAllowedHost(ctx, "ok", "nqn.2014-08.org.nvmexpress:"+bad)
			_, calls["export host nqn"] = c.SetExportHost(ctx, "ok", "nqn.2014-08.org.nvmexpress:"+bad, true)
			_, calls["close export nqn"] = c.CloseExport(ctx, "ok", "nqn.2014-08.org.nvmexpress:"+bad)
			_, calls["capacity"] = c.Capacity(ctx, bad)
			calls["delete path"] = c.DeleteDisk(ctx, "ok", "/storage-pool/"+bad)
		}
		for name, err := range calls {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("%s(%q) = %v, want ErrInvalidArgument", name, bad, err)
			}
		}
	}
	if cmds := env.sim.Commands(); len(cmds) != 0 {
		t.Errorf("%d commands reached the RDS, first %q", len(cmds), cmds[0].Text)
	}
}

func TestInjectedFaults(t *testing.T) {
	ctx := context.Background()
	t.Run("not enough space leaves nothing behind", func(t *testing.T) {
		env := startSim(t, 2*GiB)
		c := env.client(t, nil)
		if _, err := c.CreateDisk(ctx, req("pvc-a", 3*GiB)); !errors.Is(err, ErrNoSpace) {
			t.Fatalf("got %v, want ErrNoSpace", err)
		}
		if n := countCommands(env, "/disk add"); n != 1 {
			t.Errorf("no-space create sent %d times, want 1 (never retried)", n)
		}
		env.assertNoLeftovers(t)
	})
	t.Run("connection dropped before the command runs is retried", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, nil)
		env.sim.DropBeforeExecNth(1, "/disk add")
		if _, err := c.CreateDisk(ctx, req("pvc-a", GiB)); err != nil {
			t.Fatal(err)
		}
		if len(env.sim.Disks()) != 1 || c.Dials() != 2 {
			t.Errorf("disks %d, dials %d; want 1 disk and a reconnect", len(env.sim.Disks()), c.Dials())
		}
	})
	t.Run("connection dropped after the command ran: the retry finds the disk", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, nil)
		env.sim.DropAfterExecNth(1, "/disk add")
		d, err := c.CreateDisk(ctx, req("pvc-a", GiB))
		if err != nil || d.Size != GiB {
			t.Fatalf("CreateDisk = %+v, %v", d, err)
		}
		if len(env.sim.Disks()) != 1 {
			t.Errorf("disks: %+v", env.sim.Disks())
		}
	})
	t.Run("dropped create without retries is cleaned up", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, func(c *Config) { c.MaxAttempts = 1 })
		env.sim.DropAfterExecNth(1, "/disk add")
		if _, err := c.CreateDisk(ctx, req("pvc-a", GiB)); !errors.Is(err, ErrTransient) {
			t.Fatalf("got %v, want ErrTransient", err)
		}
		env.assertNoLeftovers(t)
	})
	t.Run("failing command is not retried", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, nil)
		env.sim.FailNth(1, "/disk add", "failure: could not create file")
		if _, err := c.CreateDisk(ctx, req("pvc-a", GiB)); !errors.Is(err, ErrCommandFailed) {
			t.Fatalf("got %v, want ErrCommandFailed", err)
		}
		if n := countCommands(env, "/disk add"); n != 1 {
			t.Errorf("failed create sent %d times, want 1", n)
		}
		env.assertNoLeftovers(t)
	})
	t.Run("garbage output", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, nil)
		if _, err := c.CreateDisk(ctx, req("pvc-a", GiB)); err != nil {
			t.Fatal(err)
		}
		env.sim.GarbageNth(1, "/disk print")
		if _, err := c.GetDisk(ctx, "pvc-a"); !errors.Is(err, ErrBadOutput) {
			t.Fatalf("got %v, want ErrBadOutput", err)
		}
		if _, err := c.GetDisk(ctx, "pvc-a"); err != nil {
			t.Fatalf("after garbage: %v", err)
		}
	})
	t.Run("failed grow of a copy removes the copy", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, nil)
		if _, err := c.CreateDisk(ctx, req("pvc-a", GiB)); err != nil {
			t.Fatal(err)
		}
		env.sim.FailNth(1, "/disk set", "failure: simulated failure")
		_, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: "pvc-b", FilePath: "/storage-pool/k8s/pvc-b.img", SourceSlot: "pvc-a", Size: 2 * GiB})
		if !errors.Is(err, ErrCommandFailed) {
			t.Fatalf("got %v, want ErrCommandFailed", err)
		}
		if d := env.sim.Disks(); len(d) != 1 || d[0].Slot != "pvc-a" {
			t.Fatalf("disks after failed copy: %+v", d)
		}
	})
	t.Run("hung command times out and is retried on the same connection", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, func(c *Config) { c.CommandTimeout = 200 * time.Millisecond })
		env.sim.HangNth(1, "/system resource")
		if _, err := c.Probe(ctx); err != nil {
			t.Fatal(err)
		}
		if c.Dials() != 1 {
			t.Errorf("dials = %d, want 1: only the hung session is given up", c.Dials())
		}
	})
	t.Run("refused connections", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, func(c *Config) { c.MaxAttempts = 3 })
		env.sim.SetRefuseConnections(true)
		if _, err := c.Probe(ctx); !errors.Is(err, ErrTransient) {
			t.Fatalf("got %v, want ErrTransient", err)
		}
		if st := env.sim.Stats(); st.Refused != 3 {
			t.Errorf("refused %d connections, want 3 attempts", st.Refused)
		}
		env.sim.SetRefuseConnections(false)
		if _, err := c.Probe(ctx); err != nil {
			t.Fatalf("after the RDS accepts again: %v", err)
		}
	})
	t.Run("caller's context bounds the retries", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, func(c *Config) { c.MaxAttempts = 1000 })
		env.sim.SetRefuseConnections(true)
		cctx, cancel := context.WithCancel(ctx)
		go func() {
			// Cancel once the RDS has refused a few attempts.
			for env.sim.Stats().Refused < 3 {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}()
		if _, err := c.Probe(cctx); !errors.Is(err, ErrTransient) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestConcurrentCommandsShareOneConnection(t *testing.T) {
	env := startSim(t, 10*GiB)
	c := env.client(t, func(c *Config) { c.MaxSessions = 3 })
	ctx := context.Background()
	if _, err := c.CreateDisk(ctx, req("pvc-a", GiB)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d, err := c.GetDisk(ctx, "pvc-a"); err != nil || d.Size != GiB {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent get: %v", err)
	}
	if c.Dials() != 1 {
		t.Errorf("dials = %d, want 1", c.Dials())
	}
}
