//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// Version skew between the controller and the node plugins (issue 37):
// in the middle of a rollout, and for as long as a node's plugin pod
// waits for its turn, the node plugin runs one release apart from the
// controller. The supported skews are the two edges tested here: a node
// plugin one release older than the controller (an upgrade rolls the
// controller first) and one release newer (a rollback rolls it first, or
// the DaemonSet was updated before the Deployment). docs/release.md.
//
// The node plugins are real processes of the other build on the loop
// connector (the NVMe/TCP connect stands in by a loop device over the
// simulator's backing file; stage, mkfs, mount and publish are the real
// code), registered with the node ID their NodeGetInfo gives; the test
// plays the kubelet with each VolumeAttachment's publish_context. With
// storage fencing on: each attachment gets its own host NQN, the export
// follows. DH-HMAC-CHAP is left off here: the loop connector cannot
// authenticate (its node plugin registers no key); the upgrade test
// covers authenticated exports on the controller's side, the VM tier the
// node's over real NVMe/TCP.
func TestNodePluginOneReleaseOlderKeepsStaging(t *testing.T) {
	t.Parallel()
	framework.RequireRelease(t, framework.PreviousRelease)
	skewStagesAndPublishes(t, currentBuild, previousRelease)
}

// The other edge: the node plugin one release newer than the controller.
func TestNodePluginOneReleaseNewerKeepsStaging(t *testing.T) {
	t.Parallel()
	framework.RequireRelease(t, framework.PreviousRelease)
	skewStagesAndPublishes(t, previousRelease, currentBuild)
}

func skewStagesAndPublishes(t *testing.T, controller, plugin releaseBuild) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (loop devices, mounts); CI runs as root")
		}
		t.Skip("needs root: the node plugins stage on loop devices and mount")
	}
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	ns := framework.TestNamespace
	ctrlBin, ctrlVersion := controller(e)
	pluginBin, pluginVersion := plugin(e)
	sim := e.StartSim(framework.SimOptions{})
	mon, err := framework.WatchAttachments(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	w := &releaseWorld{e: e, sim: sim, mon: mon, nodes: map[string]*framework.FakeKubelet{}, plugins: map[string]*framework.NodePlugin{}, vols: map[string]*releaseVolume{}}

	done := tl.Step("controller " + ctrlVersion + " with storage fencing; node plugins " + pluginVersion)
	w.dep = framework.Deploy(ctx, t, tl, e.CP, e.Dir)
	framework.DeployFile(ctx, t, tl, e.CP, "manifests/overlays/storage-fencing/fencing-rbac.yaml")
	for _, n := range []string{"node-a", "node-b"} {
		w.nodes[n] = e.NewNode(n)
		w.plugins[n] = framework.StartNodePlugin(t, tl, e.Dir, sim, framework.NodePluginOptions{Bin: pluginBin, Node: n})
		w.checkVersion(t, w.plugins[n].Endpoint, pluginVersion)
		_, node, conn, err := w.plugins[n].Clients()
		if err != nil {
			t.Fatal(err)
		}
		info, err := node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
		conn.Close()
		if err != nil {
			t.Fatalf("%s: NodeGetInfo: %v", n, err)
		}
		// node-driver-registrar's part: the kubelet records the ID.
		if err := w.nodes[n].SetNodeID(ctx, info.GetNodeId()); err != nil {
			t.Fatal(err)
		}
	}
	r := e.StartReplica(sim, w.dep, framework.ReplicaOptions{Name: "ctrl-1", DriverBin: ctrlBin,
		LeaderElection: framework.FastLeaderElection, DriverArgs: []string{"--storage-fencing=allow-host"}})
	w.checkVersion(t, r.Driver.Endpoint, ctrlVersion)
	for _, sc := range []string{"rds", "rds-block"} {
		if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass(sc, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	data := w.provision(t, "data", "rds", corev1.ReadWriteOnce, false)
	raw := w.provision(t, "raw", "rds-block", corev1.ReadWriteOnce, true)
	done()

	marker := []byte("written on node-a by a node plugin of " + pluginVersion + " under a controller of " + ctrlVersion + "\n")
	for _, v := range []*releaseVolume{data, raw} {
		done = tl.Step(v.claim + ": attached to node-a, staged and published there, written; then moved to node-b and read")
		w.attach(t, "pod-a-"+v.claim, "node-a", v)
		host := w.skewExportOpenTo(t, v, "node-a")
		kubeletWrites(t, w, v, "node-a", marker)
		w.skewConnectedAsTheAttachment(t, v, "node-a")
		if err := framework.ForceDeletePod(ctx, c, ns, "pod-a-"+v.claim); err != nil {
			t.Fatal(err)
		}
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, v.claim+" detached from node-a", framework.NoVolumeAttachment(c, v.pv, "node-a")); err != nil {
			t.Fatal(err)
		}
		w.attach(t, "pod-b-"+v.claim, "node-b", v)
		if hostB := w.skewExportOpenTo(t, v, "node-b"); hostB == host {
			t.Errorf("%s: node-b's attachment has node-a's host NQN %s", v.claim, host)
		}
		if got := kubeletReads(t, w, v, "node-b", len(marker)); !bytes.Equal(got, marker) {
			t.Errorf("%s on node-b reads %q; node-a wrote %q", v.claim, got, marker)
		}
		w.skewConnectedAsTheAttachment(t, v, "node-b")
		if got := mon.MaxAttached(v.pv); got != 1 {
			t.Errorf("%s was attached to %d nodes at once", v.claim, got)
		}
		done()
	}
}

// skewExportOpenTo waits until v's export is open to node's attachment
// alone (storage fencing) and returns that attachment's host NQN.
func (w *releaseWorld) skewExportOpenTo(t *testing.T, v *releaseVolume, node string) string {
	t.Helper()
	var host string
	if _, err := framework.WaitFor(w.e.Ctx, w.e.TL, 30*time.Second, v.claim+"'s export opens to "+node+"'s attachment alone", func(ctx context.Context) (bool, string, error) {
		var err error
		host, err = framework.AttachmentHost(ctx, w.e.Client, v.pv, node)
		d, _ := w.sim.Disk(v.handle)
		return err == nil && host != "" && d.NVMeTCPExport && d.AllowHostName == host, "allow-host " + d.AllowHostName + ", attachment host " + host, nil
	}); err != nil {
		t.Fatal(err)
	}
	return host
}

// skewConnectedAsTheAttachment: node's plugin connected v as the
// attachment's own host (publish_context's host NQN), the one host the
// export allows, and never as the node. The loop connector only
// validates the host NQN (a loop device presents no host), so a stage
// that lost it (a publish_context key the other build does not read)
// would connect here and be refused by a real RDS: it is read from the
// plugin's own record of the connect instead, which both builds log
// alike ("connected" ... attachmentHostNQN=true|false, at --v=2).
func (w *releaseWorld) skewConnectedAsTheAttachment(t *testing.T, v *releaseVolume, node string) {
	t.Helper()
	b, err := os.ReadFile(w.plugins[node].LogPath)
	if err != nil {
		t.Fatal(err)
	}
	var connects []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"connected"`) && strings.Contains(line, v.handle+`"`) {
			connects = append(connects, line)
		}
	}
	if len(connects) == 0 {
		t.Errorf("%s: the node plugin logged no connect of %s (%s)", node, v.claim, w.plugins[node].LogPath)
	}
	for _, line := range connects {
		if !strings.Contains(line, "attachmentHostNQN=true") {
			t.Errorf("%s: %s connected as the node, not as its attachment's host NQN, which alone the export allows: %s", node, v.claim, line)
		}
	}
}

// kubeletStage is the kubelet's side of a volume on node: NodeStage with
// the VolumeAttachment's publish_context, NodePublish into a pod's path;
// it returns the published path and what undoes both (also run in
// t.Cleanup, so a failed test leaves no mount or loop device).
func kubeletStage(t *testing.T, w *releaseWorld, v *releaseVolume, node string) (string, func()) {
	t.Helper()
	ctx := w.e.Ctx
	va, err := framework.AttachmentFor(ctx, w.e.Client, v.pv, node)
	if err != nil || va == nil || !va.Status.Attached {
		t.Fatalf("%s on %s: not attached (%v)", v.claim, node, err)
	}
	pv, err := w.e.Client.CoreV1().PersistentVolumes().Get(ctx, v.pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, nc, conn, err := w.plugins[node].Clients()
	if err != nil {
		t.Fatal(err)
	}
	kubelet := filepath.Join(w.e.Dir, "kubelet", node)
	staging := filepath.Join(kubelet, "plugins", v.pv, "globalmount")
	target := filepath.Join(kubelet, "pods", v.claim, "volume")
	for _, d := range []string{staging, filepath.Dir(target)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	vc := &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	if v.block {
		vc.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
	}
	undo := func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := nc.NodeUnpublishVolume(cctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, TargetPath: target}); err != nil {
			t.Errorf("%s: NodeUnpublish %s: %v", node, v.claim, err)
		}
		if _, err := nc.NodeUnstageVolume(cctx, &csipb.NodeUnstageVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, StagingTargetPath: staging}); err != nil {
			t.Errorf("%s: NodeUnstage %s: %v", node, v.claim, err)
		}
		conn.Close()
	}
	once := false
	undoOnce := func() {
		if !once {
			once = true
			undo()
		}
	}
	t.Cleanup(undoOnce)
	if _, err := nc.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, PublishContext: va.Status.AttachmentMetadata,
		StagingTargetPath: staging, VolumeCapability: vc, VolumeContext: pv.Spec.CSI.VolumeAttributes}); err != nil {
		t.Fatalf("%s: NodeStage %s with %v: %v", node, v.claim, mapKeys(va.Status.AttachmentMetadata), err)
	}
	if _, err := nc.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, PublishContext: va.Status.AttachmentMetadata,
		StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc, VolumeContext: pv.Spec.CSI.VolumeAttributes}); err != nil {
		t.Fatalf("%s: NodePublish %s: %v", node, v.claim, err)
	}
	w.e.TL.Logf("%s: %s staged and published at %s", node, v.claim, target)
	return target, undoOnce
}

// kubeletWrites stages and publishes v on node, writes data at its start
// (a file on a filesystem volume, the device's first bytes on a block
// one), and unpublishes and unstages it again, as the pod's end does.
func kubeletWrites(t *testing.T, w *releaseWorld, v *releaseVolume, node string, data []byte) {
	t.Helper()
	target, undo := kubeletStage(t, w, v, node)
	path := target
	if !v.block {
		path = filepath.Join(target, "marker")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	undo()
}

// kubeletReads stages and publishes v on node and returns its first n
// bytes (the file, or the device's), then unpublishes and unstages.
func kubeletReads(t *testing.T, w *releaseWorld, v *releaseVolume, node string, n int) []byte {
	t.Helper()
	target, undo := kubeletStage(t, w, v, node)
	defer undo()
	path := target
	if !v.block {
		path = filepath.Join(target, "marker")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	return buf
}
