package main

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// simWithKey starts the simulator and returns rdsctl's connection flags
// and a client of the driver's kind for arranging state.
func simWithKey(t *testing.T) ([]string, *rds.Client, *rdssim.Server) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	pub, err := rdssim.WriteClientKey(keyFile, "rdsctl test")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rdssim.New(rdssim.Config{DataDir: filepath.Join(dir, "pool"), AuthorizedKeys: []ssh.PublicKey{pub}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	addr, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host, portStr, _ := strings.Cut(addr, ":")
	port, _ := strconv.Atoi(portStr)
	client, err := rds.NewClient(rds.Config{Address: host, Port: port, User: "admin", KeyFile: keyFile, InsecureSkipHostKeyCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return []string{"--address", host, "--port", portStr, "--key", keyFile, "--insecure-skip-host-key-check"}, client, srv
}

// rdsctl and the driver name the same files by default: what rdsctl
// creates is where the driver looks, and rdsctl deletes the driver's
// snapshot files.
func TestRdsctlUsesTheDriversNaming(t *testing.T) {
	flags, client, srv := simWithKey(t)
	ctx := context.Background()
	if err := run(append(flags, "create", "pvc-1", "1G")); err != nil {
		t.Fatal(err)
	}
	d, err := client.GetDisk(ctx, "pvc-1")
	if err != nil {
		t.Fatal(err)
	}
	if d.FilePath != rds.VolumeFilePath(rds.DefaultVolumePath, "pvc-1") || d.FilePath != "/storage-pool/kubernetes-volumes/pvc-1.img" {
		t.Errorf("rdsctl created %s; the driver's default is %s", d.FilePath, rds.VolumeFilePath(rds.DefaultVolumePath, "pvc-1"))
	}
	// A snapshot as the driver names it (pkg/csi snapshotFilePath).
	snapFile := rds.DefaultVolumePath + "/snapshots/snap-1.src-pvc-1.t-1767323045000000006.img"
	if _, err := client.CopyDisk(ctx, rds.CopyDiskRequest{Slot: "snap-1", FilePath: snapFile, SourceSlot: "pvc-1"}); err != nil {
		t.Fatal(err)
	}
	if err := run(append(flags, "delete", "snap-1")); err != nil {
		t.Fatalf("rdsctl delete of the driver's snapshot: %v", err)
	}
	if err := run(append(flags, "delete", "pvc-1")); err != nil {
		t.Fatal(err)
	}
	if disks := srv.Disks(); len(disks) != 0 {
		t.Errorf("disks left: %+v", disks)
	}
	if _, err := client.GetFile(ctx, snapFile); err == nil {
		t.Errorf("snapshot file %s left behind", snapFile)
	}
	// A disk that is not the driver's is refused.
	if _, err := client.CreateDisk(ctx, rds.CreateDiskRequest{Slot: "other", FilePath: "/storage-pool/elsewhere/other.img", Size: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if err := run(append(flags, "delete", "other")); err == nil || !strings.Contains(err.Error(), "not a volume or snapshot file") {
		t.Errorf("delete of a foreign disk: %v", err)
	}
}

// An operator opens and closes an export with the driver's own fencing
// calls: a move turns the export off first, a close clears the host, and
// a close for a host the export is no longer open to leaves it open.
func TestRdsctlExport(t *testing.T) {
	flags, client, srv := simWithKey(t)
	ctx := context.Background()
	const a, b = "nqn.2014-08.org.nvmexpress:uuid:a", "nqn.2014-08.org.nvmexpress:uuid:b"
	state := func() (bool, string) {
		d, err := client.GetDisk(ctx, "pvc-1")
		if err != nil {
			t.Fatal(err)
		}
		return d.Exported, d.AllowHost
	}
	if err := run(append(flags, "-closed", "create", "pvc-1", "1G")); err != nil {
		t.Fatal(err)
	}
	if exp, _ := state(); exp {
		t.Fatal("-closed create exported the disk")
	}
	steps := []struct {
		args     []string
		exported bool
		host     string
		drops    int
		err      string
	}{
		{args: []string{"export", "pvc-1", "on", a}, exported: true, host: a},
		{args: []string{"export", "pvc-1", "on", a}, exported: true, host: a},
		{args: []string{"export", "pvc-1", "on", b}, exported: true, host: b, drops: 1},
		{args: []string{"-keep-connections", "export", "pvc-1", "on", a}, exported: true, host: a, drops: 1},
		{args: []string{"export", "pvc-1", "off", b}, exported: true, host: a, drops: 1, err: "left open"},
		{args: []string{"export", "pvc-1", "off"}, exported: false, host: "", drops: 2},
		{args: []string{"export", "pvc-1", "off"}, exported: false, host: "", drops: 2},
		{args: []string{"export", "pvc-1", "on", "any"}, exported: true, host: "", drops: 2},
		{args: []string{"export", "pvc-1", "off", "any"}, exported: false, host: "", drops: 3},
		{args: []string{"export", "pvc-1", "on"}, exported: false, host: "", drops: 3, err: "usage"},
		{args: []string{"export", "pvc-1", "on", "host-b"}, exported: false, host: "", drops: 3, err: "invalid argument"},
		{args: []string{"export", "pvc-9", "on", a}, exported: false, host: "", drops: 3, err: "not found"},
	}
	for _, st := range steps {
		err := run(append(flags, st.args...))
		if st.err == "" && err != nil || st.err != "" && (err == nil || !strings.Contains(err.Error(), st.err)) {
			t.Fatalf("rdsctl %s: %v, want %q", strings.Join(st.args, " "), err, st.err)
		}
		if exp, host := state(); exp != st.exported || host != st.host {
			t.Errorf("after rdsctl %s: exported %v to %q, want %v to %q", strings.Join(st.args, " "), exp, host, st.exported, st.host)
		}
		if got := srv.ConnectionDrops("pvc-1"); got != st.drops {
			t.Errorf("after rdsctl %s: %d connection drops, want %d", strings.Join(st.args, " "), got, st.drops)
		}
	}
}
