package csi

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNodeUnstageAndUnpublishTouchOnlyTheirVolume: NodeUnstageVolume and
// NodeUnpublishVolume of one volume, given a path where another volume (or
// something the node never mounted) is, refuse with FAILED_PRECONDITION
// and unmount nothing, whether the volume they name is connected on the
// node or not; NodeExpandVolume and NodeGetVolumeStats answer NOT_FOUND
// there. On real loop devices, mounts and filesystems.
func TestNodeUnstageAndUnpublishTouchOnlyTheirVolume(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	ctx := context.Background()
	a := newNodeVolume(t, env, "owner-a", nodeTestSize, mountCapability("ext4", sw))
	a.stageAndPublish(t)
	data := randomBytes(t, 64*1024)
	writeSynced(t, filepath.Join(a.target, "data"), data)
	ablk := newNodeVolume(t, env, "owner-a-block", 64*1024*1024, blockCapability(sw))
	ablk.stageAndPublish(t)
	b := newNodeVolume(t, env, "owner-b", nodeTestSize, mountCapability("ext4", sw))

	// A mount this node never made: a tmpfs.
	foreign := filepath.Join(t.TempDir(), "foreign")
	if err := os.Mkdir(foreign, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", foreign, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(foreign, unix.MNT_DETACH) })

	want := func(name string, code codes.Code, err error) {
		t.Helper()
		if status.Code(err) != code {
			t.Errorf("%s: %v, want %s", name, err, code)
		}
	}
	intact := func(when string) {
		t.Helper()
		for _, p := range []string{a.staging, a.target, ablk.target, foreign} {
			if !isMounted(t, p) {
				t.Errorf("%s: %s was unmounted", when, p)
			}
		}
		if got, err := os.ReadFile(filepath.Join(a.target, "data")); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: volume A's data: %v", when, err)
		}
		if !isBlockDevice(ablk.target) {
			t.Errorf("%s: A's raw block publish is gone", when)
		}
		if a.device(t) == "" || ablk.device(t) == "" {
			t.Errorf("%s: A's devices were detached", when)
		}
	}
	unstage := func(id, p string) error {
		_, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: p})
		return err
	}
	unpublish := func(id, p string) error {
		_, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: p})
		return err
	}
	expand := func(id, p string, c *csi.VolumeCapability) error {
		_, err := env.node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: p, VolumeCapability: c})
		return err
	}
	stats := func(id, p string) error {
		_, err := env.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p})
		return err
	}
	others := func(state string) {
		t.Helper()
		want(state+": unstage B at A's staging path", codes.FailedPrecondition, unstage(b.id(), a.staging))
		want(state+": unpublish B at A's target path", codes.FailedPrecondition, unpublish(b.id(), a.target))
		want(state+": unpublish B at A's raw block target", codes.FailedPrecondition, unpublish(b.id(), ablk.target))
		want(state+": unstage B at a tmpfs the node never mounted", codes.FailedPrecondition, unstage(b.id(), foreign))
		want(state+": unpublish B at a tmpfs the node never mounted", codes.FailedPrecondition, unpublish(b.id(), foreign))
		intact(state)
	}

	others("B not connected")
	b.stageAndPublish(t)
	others("B staged and published")
	want("expand B at A's target path", codes.NotFound, expand(b.id(), a.target, nil))
	want("expand B as raw block at A's raw block target", codes.NotFound, expand(b.id(), ablk.target, blockCapability(sw)))
	want("expand B as raw block at A's filesystem", codes.NotFound, expand(b.id(), a.target, blockCapability(sw)))
	want("stats of B at A's target path", codes.NotFound, stats(b.id(), a.target))
	want("stats of B at A's raw block target", codes.NotFound, stats(b.id(), ablk.target))
	intact("after expand and stats")

	// Mounts made before the node kept records are tied by their device
	// while the volume is connected.
	records, err := filepath.Glob(filepath.Join(env.ns.records.dir, "mount-*.json"))
	if err != nil || len(records) != 5 {
		t.Fatalf("records of the 5 mounts made: %v, %v", records, err)
	}
	for _, r := range records {
		if err := os.Remove(r); err != nil {
			t.Fatal(err)
		}
	}
	others("without records")
	for _, v := range []*nodeVolume{a, ablk, b} {
		v.teardown(t)
	}
	if left, _ := filepath.Glob(filepath.Join(env.ns.records.dir, "mount-*.json")); len(left) != 0 {
		t.Errorf("records left after every volume was unstaged: %v", left)
	}
}

// TestNodeTeardownAfterTheDeviceIsGone: a volume whose device vanished
// under its mounts (here: deleted on the RDS, so its loop device is over
// a deleted file and no longer the volume's device) is still unpublished
// and unstaged, tied to its mounts by the node's records; another
// volume's unstage at its staging path is refused.
func TestNodeTeardownAfterTheDeviceIsGone(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	ctx := context.Background()
	lost := newNodeVolume(t, env, "lost", nodeTestSize, mountCapability("xfs", sw))
	lost.stageAndPublish(t)
	other := newNodeVolume(t, env, "other", nodeTestSize, mountCapability("ext4", sw))
	if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: lost.id()}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	if lost.device(t) != "" {
		t.Fatal("the deleted volume still has a device")
	}
	for range 2 {
		lost.must(t, "NodeUnpublishVolume", lost.unpublish(t))
	}
	_, err := env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: other.id(), StagingTargetPath: lost.staging})
	if status.Code(err) != codes.FailedPrecondition || !isMounted(t, lost.staging) {
		t.Errorf("unstage of another volume at the lost volume's staging path: %v, still mounted %t", err, isMounted(t, lost.staging))
	}
	for range 2 {
		lost.must(t, "NodeUnstageVolume", lost.unstage(t))
	}
	if isMounted(t, lost.staging) || isMounted(t, lost.target) {
		t.Error("the lost volume's mounts are still there")
	}
}
