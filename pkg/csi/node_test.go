package csi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	utilexec "k8s.io/utils/exec"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// The node tests walk volumes through the real node service, the real
// controller and the RDS simulator over SSH, on real loop devices with the
// host's mkfs, mount, resize2fs and xfs_growfs. They need root.

func (v *nodeVolume) stats(t testing.TB, p string) (bytesUsed, inodesUsed int64) {
	t.Helper()
	u := v.usage(t, p)
	return u[csi.VolumeUsage_BYTES].Used, u[csi.VolumeUsage_INODES].Used
}

func (v *nodeVolume) usage(t testing.TB, p string) map[csi.VolumeUsage_Unit]*csi.VolumeUsage {
	t.Helper()
	resp, err := v.env.node.NodeGetVolumeStats(context.Background(), &csi.NodeGetVolumeStatsRequest{VolumeId: v.id(), VolumePath: p})
	if err != nil {
		t.Fatalf("NodeGetVolumeStats %s: %v", p, err)
	}
	out := map[csi.VolumeUsage_Unit]*csi.VolumeUsage{}
	for _, u := range resp.Usage {
		out[u.Unit] = u
	}
	if out[csi.VolumeUsage_BYTES] == nil || out[csi.VolumeUsage_INODES] == nil {
		t.Fatalf("NodeGetVolumeStats %s: %v, want bytes and inodes", p, resp.Usage)
	}
	return out
}

func fsTotal(t testing.TB, p string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Bsize
}

// TestNodeFilesystemLifecycle: stage -> publish -> write -> unpublish ->
// unstage -> stage again -> the data is there, for both filesystems; the
// device is formatted once, stats move with a write, a read-only publish
// refuses writes, and unstage detaches the device.
func TestNodeFilesystemLifecycle(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	for i, fsType := range SupportedFsTypes {
		t.Run(fsType, func(t *testing.T) {
			v := newNodeVolume(t, env, fmt.Sprintf("fs-lifecycle-%d", i), nodeTestSize, mountCapability(fsType, sw))
			v.stageAndPublish(t)
			dev := v.device(t)
			if got := blkidType(t, dev); got != fsType {
				t.Fatalf("blkid finds %q on %s, want %s", got, dev, fsType)
			}
			usedBefore, inodesBefore := v.stats(t, v.target)
			data := randomBytes(t, 8*rds.MiB)
			writeSynced(t, filepath.Join(v.target, "data"), data)
			usedAfter, inodesAfter := v.stats(t, v.target)
			if usedAfter < usedBefore+int64(len(data)) || inodesAfter != inodesBefore+1 {
				t.Errorf("stats after writing %d bytes in one file: used %d -> %d bytes, %d -> %d inodes", len(data), usedBefore, usedAfter, inodesBefore, inodesAfter)
			}
			// The staging path reports the same filesystem (its size: what
			// is in use may move with xfs's background trimming).
			staged, published := v.usage(t, v.staging), v.usage(t, v.target)
			for _, unit := range []csi.VolumeUsage_Unit{csi.VolumeUsage_BYTES, csi.VolumeUsage_INODES} {
				if staged[unit].Total != published[unit].Total || staged[unit].Total <= 0 {
					t.Errorf("%s total: staging path %d, target path %d", unit, staged[unit].Total, published[unit].Total)
				}
			}
			if b := staged[csi.VolumeUsage_BYTES]; b.Total > nodeTestSize || b.Total < nodeTestSize*8/10 {
				t.Errorf("a %d-byte volume's filesystem reports %d bytes", nodeTestSize, b.Total)
			}

			v.teardown(t)
			if isMounted(t, v.staging) || !pathMissing(v.target) {
				t.Errorf("after unstage: staging mounted %t, target exists %t", isMounted(t, v.staging), !pathMissing(v.target))
			}
			if d := v.device(t); d != "" {
				t.Errorf("after unstage the volume is still attached as %s", d)
			}

			v.stageAndPublish(t)
			got, err := os.ReadFile(filepath.Join(v.target, "data"))
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("after restaging: read %d bytes (%v), the data written before is not intact", len(got), err)
			}
			v.must(t, "NodeUnpublishVolume", v.unpublish(t))

			// Read-only publish of the same staged volume.
			v.must(t, "NodePublishVolume readonly", v.publish(t, true))
			err = os.WriteFile(filepath.Join(v.target, "other"), []byte("x"), 0o640)
			if !errors.Is(err, unix.EROFS) {
				t.Errorf("writing through a read-only publish: %v, want EROFS", err)
			}
			// Publishing the same target read-write now is a conflict.
			if err := v.publish(t, false); status.Code(err) != codes.AlreadyExists {
				t.Errorf("publish read-write over a read-only publish: %v, want AlreadyExists", err)
			}
			v.teardown(t)
		})
	}
}

// TestNodeBlockVolume: a raw block volume is published as a device node
// at the target file; what is written there lands in the volume's backing
// file on the RDS and reads back.
func TestNodeBlockVolume(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	v := newNodeVolume(t, env, "block-volume", 64*rds.MiB, blockCapability(sw))
	v.stageAndPublish(t)
	if isMounted(t, v.staging) {
		t.Error("a raw block volume's staging path is mounted")
	}
	if !isBlockDevice(v.target) {
		t.Fatalf("%s is not a block device after publish", v.target)
	}
	data := randomBytes(t, 1*rds.MiB)
	const off = 40 * rds.MiB
	f, err := os.OpenFile(v.target, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, off); err != nil || !bytes.Equal(got, data) {
		t.Errorf("reading back through the published device: %v, equal %t", err, bytes.Equal(got, data))
	}
	f.Close()
	disk, _ := env.disk(v.id())
	if got := readAt(t, disk.BackingFile, off, len(data)); !bytes.Equal(got, data) {
		t.Error("the data written through the published device is not in the volume's backing file")
	}
	size, err := blockDeviceSize(v.target)
	if err != nil || size != 64*rds.MiB {
		t.Errorf("published device size %d (%v), want %d", size, err, 64*rds.MiB)
	}
	resp, err := env.node.NodeGetVolumeStats(context.Background(), &csi.NodeGetVolumeStatsRequest{VolumeId: v.id(), VolumePath: v.target})
	if err != nil || len(resp.Usage) != 1 || resp.Usage[0].Total != 64*rds.MiB {
		t.Errorf("block stats: %v %v", resp, err)
	}
	// The device is in use while published: unstage refuses to detach it.
	if err := v.unstage(t); err == nil {
		t.Error("unstaging a published raw block volume succeeded")
	} else if v.device(t) == "" {
		t.Errorf("the refused unstage detached the device: %v", err)
	}
	v.teardown(t)
	if !pathMissing(v.target) || v.device(t) != "" {
		t.Errorf("after teardown: target exists %t, device %q", !pathMissing(v.target), v.device(t))
	}
}

// TestNodeExpandVolume grows a volume on the RDS (ControllerExpandVolume)
// and then the mounted filesystem (NodeExpandVolume), for both
// filesystems, and a raw block device.
func TestNodeExpandVolume(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	const grown = 2 * nodeTestSize
	expand := func(t *testing.T, v *nodeVolume, p string) int64 {
		t.Helper()
		c, err := env.ctrl.ControllerExpandVolume(context.Background(), &csi.ControllerExpandVolumeRequest{
			VolumeId: v.id(), CapacityRange: &csi.CapacityRange{RequiredBytes: grown}, VolumeCapability: v.cap})
		if err != nil {
			t.Fatalf("ControllerExpandVolume: %v", err)
		}
		for range 2 { // the second call finds nothing to do
			n, err := env.node.NodeExpandVolume(context.Background(), &csi.NodeExpandVolumeRequest{
				VolumeId: v.id(), VolumePath: p, StagingTargetPath: v.staging,
				CapacityRange: &csi.CapacityRange{RequiredBytes: c.CapacityBytes}, VolumeCapability: v.cap})
			if err != nil {
				t.Fatalf("NodeExpandVolume: %v", err)
			}
			if n.CapacityBytes != c.CapacityBytes {
				t.Errorf("NodeExpandVolume reports %d bytes, the RDS %d", n.CapacityBytes, c.CapacityBytes)
			}
		}
		return c.CapacityBytes
	}
	for i, fsType := range SupportedFsTypes {
		t.Run(fsType, func(t *testing.T) {
			if fsType == "ext4" && !haveCapability(t, unix.CAP_SYS_RESOURCE) {
				t.Skip("the kernel grows a mounted ext4 only for CAP_SYS_RESOURCE (EXT4_IOC_RESIZE_FS), which this process lacks (not in its bounding set; e.g. a restricted container): resize2fs fails with \"Permission denied to resize filesystem\". The node plugin's pod is privileged.")
			}
			v := newNodeVolume(t, env, fmt.Sprintf("expand-%d", i), nodeTestSize, mountCapability(fsType, sw))
			v.stageAndPublish(t)
			data := randomBytes(t, rds.MiB)
			writeSynced(t, filepath.Join(v.target, "data"), data)
			before := fsTotal(t, v.target)
			size := expand(t, v, v.target)
			after := fsTotal(t, v.target)
			// The filesystem's own metadata takes a few percent.
			if after <= before || after < size*9/10 {
				t.Errorf("%s: filesystem size %d -> %d bytes after growing the volume to %d", fsType, before, after, size)
			}
			if got, err := os.ReadFile(filepath.Join(v.target, "data")); err != nil || !bytes.Equal(got, data) {
				t.Errorf("data not intact after expansion: %v", err)
			}
			v.teardown(t)
		})
	}
	t.Run("block", func(t *testing.T) {
		v := newNodeVolume(t, env, "expand-block", nodeTestSize, blockCapability(sw))
		v.stageAndPublish(t)
		size := expand(t, v, v.target)
		if got, err := blockDeviceSize(v.target); err != nil || got != size {
			t.Errorf("published device has %d bytes (%v), want %d", got, err, size)
		}
		v.teardown(t)
	})
}

// TestNodeNeverReformats: a filesystem on the volume is mounted, never
// formatted, whatever fsType the request names; a device with data blkid
// does not recognise is refused, byte for byte untouched.
func TestNodeNeverReformats(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})

	t.Run("existing filesystem, other fsType requested", func(t *testing.T) {
		v := newNodeVolume(t, env, "keep-ext4", nodeTestSize, mountCapability("ext4", sw))
		v.stageAndPublish(t)
		data := randomBytes(t, 4096)
		writeSynced(t, filepath.Join(v.target, "data"), data)
		v.teardown(t)

		v.cap = mountCapability("xfs", sw)
		err := v.stage(t)
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("staging an ext4 volume as xfs: %v, want FailedPrecondition", err)
		}
		if isMounted(t, v.staging) {
			t.Error("the refused stage left a mount")
		}
		if got := blkidType(t, v.device(t)); got != "ext4" {
			t.Fatalf("after the refused stage blkid finds %q, want the ext4 that was there", got)
		}
		v.must(t, "NodeUnstageVolume", v.unstage(t))
		v.cap = mountCapability("ext4", sw)
		v.stageAndPublish(t)
		if got, err := os.ReadFile(filepath.Join(v.target, "data")); err != nil || !bytes.Equal(got, data) {
			t.Errorf("data not intact: %v", err)
		}
		v.teardown(t)
	})

	t.Run("a filesystem made outside the driver", func(t *testing.T) {
		v := newNodeVolume(t, env, "foreign-xfs", nodeTestSize, mountCapability("xfs", sw))
		disk, _ := env.disk(v.id())
		// 4 KiB sectors: a file-backed nvmet namespace (the VM tier) has
		// 4 KiB logical blocks, and xfs refuses smaller sectors than the
		// device's; a loop device (512) takes either.
		if out, err := exec.Command("mkfs.xfs", "-q", "-s", "size=4096", "-L", "outside", disk.BackingFile).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.xfs: %v: %s", err, out)
		}
		v.stageAndPublish(t)
		out, err := exec.Command("blkid", "-p", "-s", "LABEL", "-o", "value", v.device(t)).Output()
		if err != nil || string(bytes.TrimSpace(out)) != "outside" {
			t.Errorf("the volume's label is %q (%v): it was reformatted", out, err)
		}
		v.teardown(t)
	})

	t.Run("data without a filesystem", func(t *testing.T) {
		v := newNodeVolume(t, env, "unknown-data", nodeTestSize, mountCapability("ext4", sw))
		disk, _ := env.disk(v.id())
		// Not a signature blkid knows, but not blank either: e.g. an
		// encrypted volume's ciphertext.
		junk := randomBytes(t, 4096)
		junk[0] = 0 // no accidental magic at offset 0
		writeAt(t, disk.BackingFile, 8192, junk)
		before := readAt(t, disk.BackingFile, 0, int(rds.MiB))
		err := v.stage(t)
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("staging a volume with unrecognised data: %v, want FailedPrecondition", err)
		}
		if got := readAt(t, disk.BackingFile, 0, int(rds.MiB)); !bytes.Equal(got, before) {
			t.Error("the volume's data changed")
		}
		v.must(t, "NodeUnstageVolume", v.unstage(t))
	})

	t.Run("data at the end of the device", func(t *testing.T) {
		v := newNodeVolume(t, env, "tail-data", nodeTestSize, mountCapability("ext4", sw))
		disk, _ := env.disk(v.id())
		writeAt(t, disk.BackingFile, disk.Size-512, []byte("backup GPT header"))
		if err := v.stage(t); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("staging a volume with data in its last MiB: %v, want FailedPrecondition", err)
		}
		v.must(t, "NodeUnstageVolume", v.unstage(t))
	})
}

// TestNodeUnreadableDeviceIsNeverFormatted: blkid exits 2 ("nothing
// found") when it cannot open the device at all, which SafeFormatAndMount
// alone would take as blank. The node must fail instead, and never run
// mkfs. The device is a real block device node with no driver behind it
// (major 240, reserved for local use), so every open fails with ENXIO.
func TestNodeUnreadableDeviceIsNeverFormatted(t *testing.T) {
	requireNodeHost(t)
	dir := t.TempDir()
	dev := filepath.Join(dir, "dead-device")
	if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(240, 77))); err != nil {
		t.Fatalf("mknod: %v", err)
	}
	if out, err := exec.Command("blkid", "-p", dev).CombinedOutput(); err == nil {
		t.Fatalf("blkid read the dead device: %s", out)
	}
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	rec := &recordingExec{Interface: env.ns.mounter.Exec}
	env.ns.mounter.Exec = rec
	env.ns.connector = fixedDevice{Connector: env.ns.connector, dev: dev}
	v := newNodeVolume(t, env, "dead-device", nodeTestSize, mountCapability("ext4", sw))
	err := v.stage(t)
	if err == nil {
		t.Fatal("staging an unreadable device succeeded")
	}
	t.Logf("stage on an unreadable device: %v", err)
	for _, c := range rec.commands() {
		if len(c) > 0 && (c[0] == "mkfs.ext4" || c[0] == "mkfs.xfs" || c[0] == "mkfs") {
			t.Errorf("mkfs ran on an unreadable device: %v", c)
		}
	}
	if isMounted(t, v.staging) {
		t.Error("something was mounted")
	}
}

// TestNodeBadInputs: each malformed or impossible request gets the code
// the CSI spec names, and changes nothing.
func TestNodeBadInputs(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	ctx := context.Background()
	fsCap := mountCapability("ext4", sw)
	v := newNodeVolume(t, env, "bad-inputs", nodeTestSize, fsCap)
	unknown := "pvc-00000000-0000-0000-0000-000000000000"
	vc := v.vol.VolumeContext
	unknownVC := map[string]string{VolumeContextNVMeAddress: "127.0.0.1", VolumeContextNQN: testNQNPrefix + unknown}
	other := filepath.Join(t.TempDir(), "other")
	call := func(name string, want codes.Code, f func() error) {
		t.Helper()
		if err := f(); status.Code(err) != want {
			t.Errorf("%s: %v, want %s", name, err, want)
		}
	}
	stage := func(r *csi.NodeStageVolumeRequest) func() error {
		return func() error { _, err := env.node.NodeStageVolume(ctx, r); return err }
	}
	publish := func(r *csi.NodePublishVolumeRequest) func() error {
		return func() error { _, err := env.node.NodePublishVolume(ctx, r); return err }
	}

	call("stage without volume ID", codes.InvalidArgument, stage(&csi.NodeStageVolumeRequest{StagingTargetPath: v.staging, VolumeCapability: fsCap}))
	call("stage without staging path", codes.InvalidArgument, stage(&csi.NodeStageVolumeRequest{VolumeId: v.id(), VolumeCapability: fsCap, VolumeContext: vc}))
	call("stage with a relative staging path", codes.InvalidArgument, stage(&csi.NodeStageVolumeRequest{VolumeId: v.id(), StagingTargetPath: "staging", VolumeCapability: fsCap, VolumeContext: vc}))
	call("stage without capability", codes.InvalidArgument, stage(&csi.NodeStageVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging, VolumeContext: vc}))
	call("stage with an unsupported filesystem", codes.InvalidArgument, stage(&csi.NodeStageVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging, VolumeCapability: mountCapability("btrfs", sw), VolumeContext: vc}))
	call("stage a filesystem multi-node writer", codes.InvalidArgument, stage(&csi.NodeStageVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging, VolumeCapability: mountCapability("ext4", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER), VolumeContext: vc}))
	call("stage with a foreign NQN", codes.InvalidArgument, stage(&csi.NodeStageVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging, VolumeCapability: fsCap, VolumeContext: map[string]string{VolumeContextNQN: "nqn.2014-08.org.nvmexpress:other"}}))
	call("stage an unknown volume", codes.NotFound, stage(&csi.NodeStageVolumeRequest{VolumeId: unknown, StagingTargetPath: v.staging, VolumeCapability: fsCap, VolumeContext: unknownVC}))
	call("stage a malformed volume ID", codes.NotFound, stage(&csi.NodeStageVolumeRequest{VolumeId: "../etc", StagingTargetPath: v.staging, VolumeCapability: fsCap, VolumeContext: vc}))
	call("stage a blank read-only-many volume", codes.FailedPrecondition, stage(&csi.NodeStageVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging, VolumeCapability: mountCapability("ext4", mnro), VolumeContext: vc}))
	if blkidType(t, v.device(t)) != "" {
		t.Error("a read-only stage formatted the volume")
	}
	call("unstage the refused read-only stage", codes.OK, func() error { return v.unstage(t) })

	call("publish without target path", codes.InvalidArgument, publish(&csi.NodePublishVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging, VolumeCapability: fsCap, VolumeContext: vc}))
	call("publish without staging path", codes.InvalidArgument, publish(&csi.NodePublishVolumeRequest{VolumeId: v.id(), TargetPath: v.target, VolumeCapability: fsCap, VolumeContext: vc}))
	call("publish without capability", codes.InvalidArgument, publish(&csi.NodePublishVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging, TargetPath: v.target, VolumeContext: vc}))
	call("publish before stage", codes.FailedPrecondition, func() error { return v.publish(t, false) })

	call("unstage without staging path", codes.InvalidArgument, func() error {
		_, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id()})
		return err
	})
	call("unpublish without target path", codes.InvalidArgument, func() error {
		_, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id()})
		return err
	})
	call("unpublish a path that was never published", codes.OK, func() error { return v.unpublish(t) })
	call("unstage a volume that was never staged", codes.OK, func() error { return v.unstage(t) })

	// A staged and published volume, then requests that do not match it.
	v.stageAndPublish(t)
	call("stage again as another filesystem", codes.AlreadyExists, stage(&csi.NodeStageVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging, VolumeCapability: mountCapability("xfs", sw), VolumeContext: vc}))
	call("unstage while published", codes.FailedPrecondition, func() error { return v.unstage(t) })
	call("second publish of a single-writer volume", codes.FailedPrecondition, publish(&csi.NodePublishVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging, TargetPath: other, VolumeCapability: mountCapability("ext4", sswr), VolumeContext: vc}))
	call("second publish of a single-node-writer volume", codes.OK, publish(&csi.NodePublishVolumeRequest{VolumeId: v.id(), StagingTargetPath: v.staging, TargetPath: other, VolumeCapability: fsCap, VolumeContext: vc}))
	call("unpublish the second target", codes.OK, func() error {
		_, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id(), TargetPath: other})
		return err
	})
	stats := func(id, p string) func() error {
		return func() error {
			_, err := env.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p})
			return err
		}
	}
	call("stats without volume path", codes.InvalidArgument, stats(v.id(), ""))
	call("stats of an unknown volume", codes.NotFound, stats(unknown, v.target))
	call("stats at a path that does not exist", codes.NotFound, stats(v.id(), other))
	call("stats at a relative path", codes.NotFound, stats(v.id(), "some/path"))
	expand := func(id, p string, r *csi.CapacityRange) func() error {
		return func() error {
			_, err := env.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: p, CapacityRange: r})
			return err
		}
	}
	call("expand without volume path", codes.InvalidArgument, expand(v.id(), "", nil))
	call("expand an unknown volume", codes.NotFound, expand(unknown, v.target, nil))
	call("expand at a path where the volume is not", codes.NotFound, expand(v.id(), other, nil))
	call("expand with limit below required", codes.InvalidArgument, expand(v.id(), v.target, &csi.CapacityRange{RequiredBytes: 2 * rds.GiB, LimitBytes: rds.GiB}))
	health := func(id string) func() error {
		return func() error {
			_, err := env.node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id})
			return err
		}
	}
	call("health without volume ID", codes.InvalidArgument, health(""))
	call("health of a volume not staged here", codes.NotFound, health(unknown))
	v.teardown(t)
}

// TestNodeVolumeHealth: healthy while staged; DEGRADED when the kernel
// made the filesystem read-only; INACCESSIBLE when the device went away
// under the mounts (here: the volume deleted on the RDS).
func TestNodeVolumeHealth(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	v := newNodeVolume(t, env, "health", nodeTestSize, mountCapability("ext4", sw))
	v.stageAndPublish(t)
	health := func() []*csi.VolumeHealth_VolumeHealthEntry {
		t.Helper()
		resp, err := env.node.NodeGetVolumeHealth(context.Background(), &csi.NodeGetVolumeHealthRequest{
			VolumeId: v.id(), VolumePublishPath: v.target, StagingTargetPath: v.staging})
		if err != nil {
			t.Fatalf("NodeGetVolumeHealth: %v", err)
		}
		if resp.VolumeHealth.VolumeId != v.id() {
			t.Errorf("health of %q, want %q", resp.VolumeHealth.VolumeId, v.id())
		}
		return resp.VolumeHealth.HealthStatuses
	}
	if h := health(); len(h) != 0 {
		t.Errorf("a freshly staged volume reports %v", h)
	}
	// What errors=remount-ro does after an I/O error: the filesystem
	// (superblock) turns read-only under the read-write publish.
	if out, err := exec.Command("mount", "-o", "remount,ro", v.staging).CombinedOutput(); err != nil {
		t.Fatalf("remount ro: %v: %s", err, out)
	}
	h := health()
	if len(h) != 1 || h[0].Status != csi.VolumeHealthErrorType_DEGRADED || h[0].Reason != HealthFilesystemReadOnly {
		t.Errorf("after the filesystem went read-only: %v, want DEGRADED %s", h, HealthFilesystemReadOnly)
	}
	if out, err := exec.Command("mount", "-o", "remount,rw", v.staging).CombinedOutput(); err != nil {
		t.Fatalf("remount rw: %v: %s", err, out)
	}
	if h := health(); len(h) != 0 {
		t.Errorf("after remounting read-write: %v", h)
	}
	if _, err := env.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: v.id()}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	h = health()
	// A loop device goes at once; an NVMe/TCP controller reconnects
	// until ctrl_loss_tmo (the VM tier, node_vm_test.go) and only then
	// takes the device with it.
	gone := HealthDeviceGone
	if vmTransport != nil {
		gone = HealthPathDown
	}
	if len(h) != 1 || h[0].Status != csi.VolumeHealthErrorType_INACCESSIBLE || h[0].Reason != gone {
		t.Errorf("after the volume was deleted under its mounts: %v, want INACCESSIBLE %s", h, gone)
	}
	// Cleaning up after a lost volume works: the mounts go, the loop
	// device over the deleted file is detached.
	v.teardown(t)
	if isMounted(t, v.staging) {
		t.Error("staging path still mounted")
	}
}

// haveCapability reports whether this process has capability c in effect.
func haveCapability(t testing.TB, c int) bool {
	t.Helper()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatalf("capget: %v", err)
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
}

// recordingExec runs commands for real and remembers them.
type recordingExec struct {
	utilexec.Interface
	mu  sync.Mutex
	ran [][]string
}

func (r *recordingExec) record(cmd string, args []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ran = append(r.ran, append([]string{cmd}, args...))
}

func (r *recordingExec) Command(cmd string, args ...string) utilexec.Cmd {
	r.record(cmd, args)
	return r.Interface.Command(cmd, args...)
}

func (r *recordingExec) CommandContext(ctx context.Context, cmd string, args ...string) utilexec.Cmd {
	r.record(cmd, args)
	return r.Interface.CommandContext(ctx, cmd, args...)
}

func (r *recordingExec) commands() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ran)
}

// fixedDevice is a connector whose every volume is one given device node.
type fixedDevice struct {
	Connector
	dev string
}

func (f fixedDevice) Connect(context.Context, nvme.Target) (string, error) { return f.dev, nil }
func (f fixedDevice) DevicePath(context.Context, string) (string, error)   { return f.dev, nil }
func (f fixedDevice) Disconnect(context.Context, string, nvme.InUseFunc) error {
	return nil
}
