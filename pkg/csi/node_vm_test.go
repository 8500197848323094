//go:build nvmevm

package csi

// The NVMe/TCP VM tier (make e2e-nvme; e2e/nvme boots the VM): inside it,
// RDS_NVME_VM=1 makes every LoopNode environment use the real stack — the
// simulator exports through the kernel's nvmet, the node service connects
// with nvme.TCPConnector — so the node tests (TestNode*) and csi-sanity's
// Node specs run over NVMe/TCP. The tests below need the real stack
// itself: a path that goes down and comes back, a second node, a volume
// the target does not export.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

const vmNvmetPort = 4420

type nvmeVM struct{ etc string }

func init() {
	if os.Getenv("RDS_NVME_VM") == "1" {
		// One node identity for the whole run, as on a real node.
		vmTransport = nvmeVM{etc: "/etc/nvme"}
	}
}

func (nvmeVM) exporter(t testing.TB) rdssim.Exporter {
	e, err := rdssim.NewNvmetExporter(rdssim.NvmetConfig{Logger: klog.Background()})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (v nvmeVM) connector(t testing.TB, d *Driver) Connector {
	return vmTCPConnector(t, d, v.etc)
}

func vmTCPConnector(t testing.TB, d *Driver, etc string) *nvme.TCPConnector {
	c, err := nvme.NewTCPConnector(nvme.Config{
		NQNPrefix:  d.opts.NQNPrefix,
		EtcNVMeDir: etc,
		// Long enough to ride out the port bounce below, short enough
		// that unmounting a deleted volume (its last writes wait for the
		// path) does not hang a test for the default 5 minutes. The fast
		// I/O fail timeout defaults to the same 20 s here.
		CtrlLossTimeout: 20 * time.Second,
		ReconnectDelay:  time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func requireVM(t *testing.T) {
	t.Helper()
	if vmTransport == nil {
		t.Skip("runs inside the NVMe/TCP VM only (make e2e-nvme)")
	}
	requireNodeHost(t)
}

// poll calls cond until it reports true, failing the test after d. The
// kernel's reconnects are asynchronous; this is the bounded wait for them.
func poll(t *testing.T, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last error: %v)", what, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func healthReasons(t *testing.T, env *simEnv, v *nodeVolume) []string {
	t.Helper()
	h, err := env.node.NodeGetVolumeHealth(context.Background(), &csi.NodeGetVolumeHealthRequest{
		VolumeId: v.id(), VolumePublishPath: v.target, StagingTargetPath: v.staging})
	if err != nil {
		t.Fatalf("NodeGetVolumeHealth: %v", err)
	}
	var out []string
	for _, s := range h.VolumeHealth.GetHealthStatuses() {
		out = append(out, s.Reason)
	}
	return out
}

func portLink(nqn string) (link, subsys string) {
	root := rdssim.DefaultNvmetRoot
	return filepath.Join(root, "ports", "4420", "subsystems", nqn), filepath.Join(root, "subsystems", nqn)
}

// The target's port goes away and comes back within ctrl_loss_tmo: the
// node reports the path down meanwhile, a write issued while it is down
// completes once it is back, and the filesystem was never remounted.
func TestVMNodePathDownAndBack(t *testing.T) {
	requireVM(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	v := newNodeVolume(t, env, "path-bounce", nodeTestSize, mountCapability("ext4", sw))
	v.stageAndPublish(t)
	before, err := mountAt(v.staging)
	if err != nil || before == nil {
		t.Fatalf("staging mount: %v %v", before, err)
	}
	writeSynced(t, filepath.Join(v.target, "before"), []byte("written before the outage"))
	if r := healthReasons(t, env, v); len(r) != 0 {
		t.Fatalf("health before the outage: %v", r)
	}

	nqn := env.ns.d.nqn(v.id())
	link, subsys := portLink(nqn)
	if err := os.Remove(link); err != nil {
		t.Fatalf("taking the subsystem off the port: %v", err)
	}
	poll(t, time.Minute, "NodeGetVolumeHealth reports the path down", func() (bool, error) {
		r := healthReasons(t, env, v)
		return len(r) == 1 && r[0] == HealthPathDown, errors.New(strings.Join(r, ","))
	})

	// A write while the path is down waits in the kernel.
	data := []byte("written while the path was down")
	wrote := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(filepath.Join(v.target, "during"), os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = f.Write(data)
			if err == nil {
				err = f.Sync()
			}
			f.Close()
		}
		wrote <- err
	}()

	if err := os.Symlink(subsys, link); err != nil {
		t.Fatalf("putting the subsystem back on the port: %v", err)
	}
	poll(t, time.Minute, "NodeGetVolumeHealth reports the volume healthy again", func() (bool, error) {
		r := healthReasons(t, env, v)
		return len(r) == 0, errors.New(strings.Join(r, ","))
	})
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the write issued during the outage failed: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the write issued during the outage never completed")
	}
	after, err := mountAt(v.staging)
	if err != nil || after == nil || after.ID != before.ID || after.dev() != before.dev() {
		t.Errorf("staging mount changed across the outage: %+v -> %+v (%v)", before, after, err)
	}
	for name, want := range map[string]string{"before": "written before the outage", "during": string(data)} {
		if got, err := os.ReadFile(filepath.Join(v.target, name)); err != nil || string(got) != want {
			t.Errorf("%s: %q (%v), want %q", name, got, err, want)
		}
	}
	v.teardown(t)
}

// A volume whose disk is not exported: NodeStage is NotFound and nothing
// is left connected.
func TestVMNodeStageNotExported(t *testing.T) {
	requireVM(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true})
	v := newNodeVolume(t, env, "not-exported", nodeTestSize, mountCapability("ext4", sw))
	// Another exported volume keeps the target's port open, as on an RDS
	// that exports other disks: the connect reaches the target and is
	// refused there, rather than at the TCP level.
	newNodeVolume(t, env, "exported", nodeTestSize, mountCapability("ext4", sw))
	if out := env.routerOS(t, `/disk set [find slot="`+v.id()+`"] nvme-tcp-export=no`); out != "" {
		t.Fatalf("export off: %q", out)
	}
	err := v.stage(t)
	if status.Code(err) != codes.NotFound {
		t.Fatalf("NodeStageVolume of an unexported volume = %v, want NotFound", err)
	}
	if dev := v.device(t); dev != "" {
		t.Errorf("the refused volume is connected as %s", dev)
	}
	if isMounted(t, v.staging) {
		t.Error("the refused volume is mounted")
	}
}

// The whole path over real NVMe/TCP: CreateVolume over SSH, exported by
// nvmet; NodeStage through the kernel's initiator and a write;
// CreateSnapshot and a restore; the restore staged by a second node (its
// own host NQN, same kernel) reads the same data.
func TestVMWholePathSnapshotRestoreOnSecondNode(t *testing.T) {
	requireVM(t)
	env := startSimEnv(t, simEnvConfig{LoopNode: true, PoolSize: 4 * rds.TiB})
	ctx := context.Background()
	src := newNodeVolume(t, env, "whole-src", nodeTestSize, mountCapability("ext4", sw))
	src.stageAndPublish(t)
	data := randomBytes(t, rds.MiB)
	writeSynced(t, filepath.Join(src.target, "data"), data)

	snap, err := env.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: src.id(), Name: "whole-snap"})
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	restored, err := env.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "whole-restored", CapacityRange: &csi.CapacityRange{RequiredBytes: nodeTestSize},
		VolumeCapabilities: []*csi.VolumeCapability{src.cap},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}},
	})
	if err != nil {
		t.Fatalf("CreateVolume from the snapshot: %v", err)
	}

	// Node 2: its own host identity, its own node service, same kernel.
	node2Etc := t.TempDir()
	node2 := NewNodeServer(env.ns.d, vmTCPConnector(t, env.ns.d, node2Etc), t.TempDir())
	staging := filepath.Join(t.TempDir(), "staging")
	if err := os.Mkdir(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountBelow(t, filepath.Dir(staging)) })
	if _, err := node2.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: restored.Volume.VolumeId, StagingTargetPath: staging, VolumeCapability: src.cap, VolumeContext: restored.Volume.VolumeContext,
	}); err != nil {
		t.Fatalf("node 2 NodeStageVolume of the restore: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the restore on node 2 does not hold the source's data (%v)", err)
	}

	// The two volumes are connected under the two host NQNs.
	host1, err := os.ReadFile("/etc/nvme/hostnqn")
	if err != nil {
		t.Fatal(err)
	}
	host2, err := os.ReadFile(filepath.Join(node2Etc, "hostnqn"))
	if err != nil {
		t.Fatal(err)
	}
	for nqn, want := range map[string][]byte{env.ns.d.nqn(src.id()): host1, env.ns.d.nqn(restored.Volume.VolumeId): host2} {
		if got := controllerHostNQNs(t, nqn); len(got) != 1 || got[0] != strings.TrimSpace(string(want)) {
			t.Errorf("%s is connected as host %v, want %s", nqn, got, bytes.TrimSpace(want))
		}
	}

	if _, err := node2.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: restored.Volume.VolumeId, StagingTargetPath: staging}); err != nil {
		t.Fatalf("node 2 NodeUnstageVolume: %v", err)
	}
	src.teardown(t)
	for _, id := range []string{restored.Volume.VolumeId, src.id()} {
		if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume %s: %v", id, err)
		}
	}
	if _, err := env.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.Snapshot.SnapshotId}); err != nil {
		t.Errorf("DeleteSnapshot: %v", err)
	}
}

func controllerHostNQNs(t *testing.T, nqn string) []string {
	t.Helper()
	entries, err := os.ReadDir("/sys/class/nvme")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		dir := filepath.Join("/sys/class/nvme", e.Name())
		got, err := os.ReadFile(filepath.Join(dir, "subsysnqn"))
		if err != nil || strings.TrimSpace(string(got)) != nqn {
			continue
		}
		h, err := os.ReadFile(filepath.Join(dir, "hostnqn"))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.TrimSpace(string(h)))
	}
	return out
}
