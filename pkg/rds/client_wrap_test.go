package rds

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// TestClientReadsWrappedOutput: with the simulator printing like the
// hardware (80 columns, values broken in the middle), every read returns
// the driver's IDs, paths and NQNs exactly, so nothing looks foreign and
// no delete is refused.
func TestClientReadsWrappedOutput(t *testing.T) {
	env := startSim(t, 10*GiB)
	c := env.client(t, nil)
	ctx := context.Background()

	r := wrapReq()
	d, err := c.CreateDisk(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	want := Disk{Slot: r.Slot, Type: "file", FilePath: r.FilePath, Size: GiB, Exported: true, Port: 4420, NQN: r.Export.NQN, Flags: d.Flags}
	if *d != want {
		t.Fatalf("created %+v\nwant    %+v", *d, want)
	}
	// The reply really was broken: no line longer than 80, the NQN split.
	printed := ""
	for _, cmd := range env.sim.Commands() {
		if strings.Contains(cmd.Text, "print detail where slot=") {
			printed = cmd.Output
		}
	}
	if longestLine(printed) != 80 || strings.Contains(printed, r.Export.NQN) {
		t.Fatalf("the simulator did not wrap:\n%s", printed)
	}

	snap, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: wrapSnapshot, FilePath: wrapSnapFile, SourceSlot: wrapVolume})
	if err != nil {
		t.Fatal(err)
	}
	if snap.FilePath != wrapSnapFile || snap.Size != GiB {
		t.Fatalf("snapshot %+v", *snap)
	}
	disks, err := c.ListDisks(ctx)
	if err != nil || len(disks) != 2 || disks[0] != want || disks[1].FilePath != wrapSnapFile {
		t.Fatalf("ListDisks = %+v, %v", disks, err)
	}
	f, err := c.GetFile(ctx, wrapSnapFile)
	if err != nil || f.Name != strings.TrimPrefix(wrapSnapFile, "/") || f.Type != ".img file" {
		t.Fatalf("GetFile = %+v, %v", f, err)
	}
	if err := c.DeleteDisk(ctx, wrapSnapshot, wrapSnapFile); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteDisk(ctx, wrapVolume, r.FilePath); err != nil {
		t.Fatal(err)
	}
	env.assertNoLeftovers(t)
}

// TestClientAsksForUnwrappedOutput: by default the login name carries
// RouterOS console options for a 511-column terminal, and the simulator,
// like RouterOS, then prints each of the driver's properties whole.
func TestClientAsksForUnwrappedOutput(t *testing.T) {
	env := startSim(t, 10*GiB)
	c := env.client(t, func(cfg *Config) { cfg.LoginOptions = "" })
	r := wrapReq()
	if _, err := c.CreateDisk(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	cmds := env.sim.Commands()
	last := cmds[len(cmds)-1]
	if last.User != "admin" || last.TerminalWidth != 511 || !strings.Contains(last.Output, `nvme-tcp-server-nqn="`+r.Export.NQN+`"`) {
		t.Errorf("command log %+v", last)
	}
	if _, err := NewClient(Config{Address: "a", User: "u", Signer: env.signer, KnownHostsFile: env.known, LoginOptions: "c t"}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad login options: %v", err)
	}
}

// TestClientRefusalWithoutPrefix: RouterOS does not always start an error
// with "failure:"; a remove or set that prints anything did not succeed.
func TestClientRefusalWithoutPrefix(t *testing.T) {
	env := startSim(t, 10*GiB)
	c := env.client(t, nil)
	ctx := context.Background()
	r := wrapReq()
	if _, err := c.CreateDisk(ctx, r); err != nil {
		t.Fatal(err)
	}
	env.sim.FailNth(1, "/disk remove", "disk is in use")
	if err := c.DeleteDisk(ctx, r.Slot, r.FilePath); !errors.Is(err, ErrCommandFailed) {
		t.Errorf("DeleteDisk after %q: %v, want ErrCommandFailed", "disk is in use", err)
	}
	if len(env.sim.Disks()) != 1 {
		t.Fatalf("disks: %+v", env.sim.Disks())
	}
	env.sim.FailNth(1, "/disk set", "invalid parameter")
	if _, err := c.ResizeDisk(ctx, r.Slot, 2*GiB); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("ResizeDisk after %q: %v, want ErrInvalidArgument", "invalid parameter", err)
	}
	env.sim.FailNth(1, "print", "permission denied")
	if _, err := c.GetDisk(ctx, r.Slot); !errors.Is(err, ErrCommandFailed) {
		t.Errorf("GetDisk after %q: %v, want ErrCommandFailed", "permission denied", err)
	}
}

// TestClientExitStatusOnFailure: a simulator that also exits non-zero on a
// refusal gives the same errors.
func TestClientExitStatusOnFailure(t *testing.T) {
	env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.ExitStatusOnFailure = true })
	c := env.client(t, nil)
	ctx := context.Background()
	r := wrapReq()
	if _, err := c.CreateDisk(ctx, r); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateDisk(ctx, CreateDiskRequest{Slot: "other", FilePath: r.FilePath, Size: GiB}); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("second disk on the same file: %v, want ErrAlreadyExists", err)
	}
	if _, err := c.CreateDisk(ctx, CreateDiskRequest{Slot: "big", FilePath: wrapBase + "/big.img", Size: 20 * GiB}); !errors.Is(err, ErrNoSpace) {
		t.Errorf("too big: %v, want ErrNoSpace", err)
	}
	if _, err := c.exec(ctx, "/disk remove %s", "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("remove of a missing name: %v, want ErrNotFound", err)
	}
}

// TestKeyFilePermissions: a key file others can read is refused; one its
// group can read (a Secret mounted 0440) is accepted.
func TestKeyFilePermissions(t *testing.T) {
	env := startSim(t, GiB)
	dir := t.TempDir()
	for _, tc := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o600, true}, {0o400, true}, {0o440, true}, {0o644, false}, {0o604, false}} {
		key := filepath.Join(dir, fmt.Sprintf("key-%o", tc.mode))
		if _, err := rdssim.WriteClientKey(key, "test"); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(key, tc.mode); err != nil {
			t.Fatal(err)
		}
		cfg := env.config()
		cfg.Signer, cfg.KeyFile = nil, key
		c, err := NewClient(cfg)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidArgument)) {
			t.Errorf("mode %o: %v", tc.mode, err)
		}
		if c != nil {
			c.Close()
		}
	}
}
