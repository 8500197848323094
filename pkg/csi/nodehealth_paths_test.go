package csi

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNodeVolumeHealthJudgesOnlyItsOwnPaths: NodeGetVolumeHealth of one
// volume, given paths where another volume (or anything the node cannot
// tie to it) is mounted, answers NOT_FOUND: the volume is not there. It
// never reports the other volume's mount as this volume's device having
// been replaced or gone, whether the volume it names is connected on the
// node or not. Its own paths are still judged, also once its device was
// replaced (tied by the node's record). On real loop devices and mounts.
func TestNodeVolumeHealthJudgesOnlyItsOwnPaths(t *testing.T) {
	requireNodeHost(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	ctx := context.Background()
	a := newNodeVolume(t, env, "health-owner-a", nodeTestSize, mountCapability("ext4", sw))
	a.stageAndPublish(t)
	ablk := newNodeVolume(t, env, "health-owner-a-block", 64*1024*1024, blockCapability(sw))
	ablk.stageAndPublish(t)
	b := newNodeVolume(t, env, "health-owner-b", nodeTestSize, mountCapability("ext4", sw))

	foreign := filepath.Join(t.TempDir(), "foreign")
	if err := os.Mkdir(foreign, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", foreign, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(foreign, unix.MNT_DETACH) })

	health := func(ns csi.NodeServer, id, publish, staging string) (*csi.NodeGetVolumeHealthResponse, error) {
		return ns.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: publish, StagingTargetPath: staging})
	}
	notThere := func(state string, ns csi.NodeServer, id string) {
		t.Helper()
		for _, c := range []struct{ name, publish, staging string }{
			{"A's publish and staging paths", a.target, a.staging},
			{"A's staging path", "", a.staging},
			{"A's raw block publish", ablk.target, ""},
			{"a tmpfs the node never mounted", foreign, ""},
			{"the root filesystem", "/", ""},
		} {
			resp, err := health(ns, id, c.publish, c.staging)
			if status.Code(err) != codes.NotFound {
				t.Errorf("%s: health of %s at %s: %v, %v; want NOT_FOUND", state, id, c.name, resp.GetVolumeHealth().GetHealthStatuses(), err)
			}
		}
	}

	notThere("B not connected", env.ns, b.id())
	b.stageAndPublish(t)
	notThere("B staged and published", env.ns, b.id())
	for _, v := range []*nodeVolume{a, ablk, b} {
		resp, err := health(env.ns, v.id(), v.target, v.staging)
		if err != nil || len(resp.VolumeHealth.HealthStatuses) != 0 {
			t.Errorf("health of %s at its own paths: %v, %v; want healthy", v.id(), resp.GetVolumeHealth().GetHealthStatuses(), err)
		}
	}

	// A node on which every volume is now connected as B's device: for A,
	// whose mounts the node recorded, that is its device replaced under
	// them; for C, with no record there, A's paths are not C's.
	replaced := NewNodeServer(env.ns.d, fixedDevice{Connector: env.ns.connector, dev: b.device(t)}, env.ns.records.dir)
	resp, err := health(replaced, a.id(), a.target, a.staging)
	if err != nil || len(resp.VolumeHealth.HealthStatuses) != 1 || resp.VolumeHealth.HealthStatuses[0].Reason != HealthDeviceReplaced {
		t.Errorf("A's own paths once its device is another: %v, %v; want INACCESSIBLE %s", resp.GetVolumeHealth().GetHealthStatuses(), err, HealthDeviceReplaced)
	}
	notThere("C connected as B's device", replaced, "pvc-00000000-0000-0000-0000-0000000000c0")

	// Without records, a mount is tied by its current device alone.
	records, err := filepath.Glob(filepath.Join(env.ns.records.dir, "mount-*.json"))
	if err != nil || len(records) == 0 {
		t.Fatalf("the node's mount records: %v, %v", records, err)
	}
	for _, r := range records {
		if err := os.Remove(r); err != nil {
			t.Fatal(err)
		}
	}
	notThere("without records", env.ns, b.id())
	if resp, err := health(env.ns, a.id(), a.target, a.staging); err != nil || len(resp.VolumeHealth.HealthStatuses) != 0 {
		t.Errorf("A at its own paths without records: %v, %v; want healthy", resp.GetVolumeHealth().GetHealthStatuses(), err)
	}
	for _, v := range []*nodeVolume{a, ablk, b} {
		v.teardown(t)
	}
}
