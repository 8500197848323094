package csi

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// What the driver does under each unconfirmed behaviour of RouterOS'
// /disk add copy-from (issue 22, item 6; docs/routeros.md, facts table).

// TestCopyFromWithoutData: on an RDS whose copy-from copies no data (the
// simulator's CopyFromDataNone), a restore is an empty disk that nothing
// can tell apart from a good one: the hazard. With
// --copy-from-data=unsupported the driver refuses every copy with
// FAILED_PRECONDITION and creates nothing, while an existing snapshot and
// plain volumes still work.
func TestCopyFromWithoutData(t *testing.T) {
	ctx := context.Background()
	dataDir := filepath.Join(t.TempDir(), "pool")
	noData := func(c *rdssim.Config) { c.CopyFromData = rdssim.CopyFromDataNone }
	pattern := []byte("the volume's data, which its restore must hold")

	env := startSimEnv(t, simEnvConfig{DataDir: dataDir, Sim: noData})
	vol, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 64*rds.MiB))
	if err != nil {
		t.Fatal(err)
	}
	volID := vol.Volume.VolumeId
	if err := env.sim.WriteDisk(volID, rds.MiB, pattern); err != nil {
		t.Fatal(err)
	}
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: volID})
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.Snapshot.SnapshotId
	restored, err := env.ctrl.CreateVolume(ctx, restoreReq("pvc-restored-without-flag", snapID))
	if err != nil {
		t.Fatal(err)
	}
	got, err := env.sim.ReadDisk(restored.Volume.VolumeId, rds.MiB, len(pattern))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got, pattern) {
		t.Fatal("the simulator's copy-from=none variant copied the data")
	}
	env.stop()

	env = startSimEnv(t, simEnvConfig{DataDir: dataDir, Sim: noData, Opts: func(o *Options) { o.CopyFromData = CopyFromDataUnsupported }})
	before := len(env.sim.Disks())
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"CreateSnapshot", func() error {
			_, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snapshot-2", SourceVolumeId: volID})
			return err
		}},
		{"CreateVolume from a snapshot", func() error {
			_, err := env.ctrl.CreateVolume(ctx, restoreReq("pvc-restored-with-flag", snapID))
			return err
		}},
		{"CreateVolume from a volume", func() error {
			_, err := env.ctrl.CreateVolume(ctx, cloneReq("pvc-cloned-with-flag", volID))
			return err
		}},
	} {
		err := tc.call()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--copy-from-data=unsupported") {
			t.Errorf("%s with --copy-from-data=unsupported: %v, want FAILED_PRECONDITION naming the flag", tc.name, err)
		}
	}
	if n := len(env.sim.Disks()); n != before {
		t.Errorf("refused copies left disks behind: %d disks, %d before", n, before)
	}
	if _, err := env.ctrl.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snapID}); err != nil {
		t.Errorf("an existing snapshot under --copy-from-data=unsupported: %v", err)
	}
	if _, err := env.ctrl.CreateVolume(ctx, createReq("pvc-plain", 64*rds.MiB)); err != nil {
		t.Errorf("a volume without a content source under --copy-from-data=unsupported: %v", err)
	}
}

// TestSnapshotTakesNoExportOfItsSource: under the simulator's
// CopyFromInherit (RouterOS's CLI manual: copy-from takes the new item's
// default property values from the existing item), a snapshot of a volume
// open to a node and the volume restored from it take nothing of that
// export: the snapshot is closed with its own NQN and no allowed host, the
// restore open to any host (storage fencing off) with its own NQN; also
// where a closed export hides its properties in print.
func TestSnapshotTakesNoExportOfItsSource(t *testing.T) {
	for _, closed := range []rdssim.ClosedExportProps{rdssim.ClosedExportShown, rdssim.ClosedExportHidden} {
		t.Run(string(closed), func(t *testing.T) { testSnapshotTakesNoExport(t, closed) })
	}
}

func testSnapshotTakesNoExport(t *testing.T, closed rdssim.ClosedExportProps) {
	const hostA = "nqn.2014-08.org.nvmexpress:uuid:7d0c8a8e-4b8e-4f0e-9d53-2f6b1f1c3a01"
	ctx := context.Background()
	env := startSimEnv(t, simEnvConfig{Sim: func(c *rdssim.Config) { c.CopyFromProperties, c.ClosedExportProps = rdssim.CopyFromInherit, closed }})
	vol, err := env.ctrl.CreateVolume(ctx, createReq(testPVC, 64*rds.MiB))
	if err != nil {
		t.Fatal(err)
	}
	volID := vol.Volume.VolumeId
	if out := env.routerOS(t, `/disk set [find slot="`+volID+`"] nvme-tcp-server-allow-host-name="`+hostA+`"`); out != "" {
		t.Fatal(out)
	}
	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snapshot-1", SourceVolumeId: volID})
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.Snapshot.SnapshotId
	restored, err := env.ctrl.CreateVolume(ctx, restoreReq("pvc-restored", snapID))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []rdssim.DiskInfo{
		{Slot: snapID, NVMeTCPExport: false, NVMeTCPPort: 4420, NVMeTCPNQN: testNQNPrefix + snapID},
		{Slot: restored.Volume.VolumeId, NVMeTCPExport: true, NVMeTCPPort: 4420, NVMeTCPNQN: testNQNPrefix + restored.Volume.VolumeId},
	} {
		d, ok := env.disk(want.Slot)
		if !ok {
			t.Fatalf("no disk %s", want.Slot)
		}
		if d.NVMeTCPExport != want.NVMeTCPExport || d.NVMeTCPPort != want.NVMeTCPPort || d.NVMeTCPNQN != want.NVMeTCPNQN || d.AllowHostName != "" {
			t.Errorf("%s: exported=%v port %d NQN %q allowed host %q; want exported=%v port %d NQN %q and no allowed host (the source is open to %s)",
				d.Slot, d.NVMeTCPExport, d.NVMeTCPPort, d.NVMeTCPNQN, d.AllowHostName, want.NVMeTCPExport, want.NVMeTCPPort, want.NVMeTCPNQN, hostA)
		}
	}
}

func TestOptionsCopyFromData(t *testing.T) {
	for _, v := range []string{"", CopyFromDataSupported, CopyFromDataUnsupported, "maybe"} {
		o := Options{Mode: ModeController, DriverName: DefaultDriverName, Endpoint: "unix:///tmp/csi.sock", RDSAddress: "192.0.2.1",
			RDSPort: 22, RDSUser: "admin", RDSKeyFile: "k", RDSKnownHostsFile: "h", RDSPool: "storage-pool", VolumePath: rds.DefaultVolumePath,
			NVMePort: 4420, NQNPrefix: testNQNPrefix, CopyFromData: v}
		err := o.Validate()
		if bad := v == "maybe"; (err != nil && strings.Contains(err.Error(), "--copy-from-data")) != bad {
			t.Errorf("Validate with --copy-from-data=%q: %v", v, err)
		}
	}
}
