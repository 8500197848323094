package csi

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/srvlab/rds-csi/pkg/nvme"
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
	// The node lets go of a deleted volume's device on the kernel's
	// time: at once for a loop device whose file is gone; for an NVMe/TCP
	// namespace (the VM tier) once its controller notices, the controller
	// being deleted meanwhile with no namespace device left (ErrNoDevice).
	nqn := lost.vol.VolumeContext[VolumeContextNQN]
	waitFor(t, "the deleted volume's device to go", func() bool {
		_, err := env.ns.connector.DevicePath(ctx, nqn)
		switch {
		case errors.Is(err, nvme.ErrNotConnected), errors.Is(err, nvme.ErrNoDevice):
			return true
		case err != nil:
			t.Fatal(err)
		}
		return false
	})
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

// TestNodeUnpublishResolvesDotDotAsTheKernelDoes: a target path whose ".."
// follows a symbolic link names, for the kernel, the link's target's
// parent; lexically, the link's own directory. The path the guard checks
// must be the one that is unmounted: volume B's unpublish at
// "<dir>/link/../<name>", where <dir>/<name> holds B's mount and link
// points at volume A's target, must not unmount A.
func TestNodeUnpublishResolvesDotDotAsTheKernelDoes(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	ctx := context.Background()
	a := newNodeVolume(t, env, "dotdot-a", nodeTestSize, mountCapability("ext4", sw))
	a.stageAndPublish(t)
	b := newNodeVolume(t, env, "dotdot-b", nodeTestSize, mountCapability("ext4", sw))
	b.stageAndPublish(t)

	dir := t.TempDir()
	lexical := filepath.Join(dir, filepath.Base(a.target))
	if err := os.Mkdir(lexical, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(b.target, lexical, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mounting B's target: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(lexical, unix.MNT_DETACH) })
	if err := os.Symlink(a.target, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	p := dir + "/link/../" + filepath.Base(a.target)
	_, err := env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: b.id(), TargetPath: p})
	if !isMounted(t, a.target) {
		t.Fatalf("unpublish of B at %s (%v) unmounted volume A's target %s", p, err, a.target)
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("unpublish of B at %s: %v, want FAILED_PRECONDITION (A's mount is there)", p, err)
	}

	// A trailing "/" makes the kernel follow a last component that is a
	// link: here to C's target, whose fresh xfs is an empty directory.
	c := newNodeVolume(t, env, "dotdot-c", nodeTestSize, mountCapability("xfs", sw))
	c.stageAndPublish(t)
	if err := os.Symlink(c.target, filepath.Join(dir, "clink")); err != nil {
		t.Fatal(err)
	}
	p = filepath.Join(dir, "clink") + "/"
	_, err = env.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: b.id(), TargetPath: p})
	if !isMounted(t, c.target) {
		t.Fatalf("unpublish of B at %s (%v) unmounted volume C's target %s", p, err, c.target)
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("unpublish of B at %s: %v, want FAILED_PRECONDITION (C's mount is there)", p, err)
	}
	c.teardown(t)

	// The same for unstage: B's own staging path, reached lexically
	// through a link to A's staging path, names A's for the kernel.
	b.must(t, "NodeUnpublishVolume", b.unpublish(t))
	link := filepath.Join(filepath.Dir(b.staging), "link")
	if err := os.Symlink(a.staging, link); err != nil {
		t.Fatal(err)
	}
	p = link + "/../" + filepath.Base(a.staging)
	if filepath.Clean(p) != b.staging {
		t.Fatalf("test set-up: %s is not lexically B's staging path %s", p, b.staging)
	}
	_, err = env.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: b.id(), StagingTargetPath: p})
	if !isMounted(t, a.staging) {
		t.Fatalf("unstage of B at %s (%v) unmounted volume A's staging path %s", p, err, a.staging)
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("unstage of B at %s: %v, want FAILED_PRECONDITION (A's mount is there)", p, err)
	}
	if !isMounted(t, b.staging) {
		t.Errorf("B's staging path was unmounted by an unstage that named A's")
	}
	b.must(t, "NodeUnpublishVolume", b.unpublish(t))
	if err := unix.Unmount(lexical, 0); err != nil {
		t.Fatal(err)
	}
	a.teardown(t)
	b.must(t, "NodeUnstageVolume", b.unstage(t))
}
