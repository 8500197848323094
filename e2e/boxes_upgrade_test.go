//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// A volume made while the driver served one RDS (today's flags, no
// --rds-config; its nodes registered as a one-box node plugin registers
// them) keeps working once the driver is restarted with a list of two
// boxes (issue 36): its ID and PV are untouched, a re-publish to its
// holder goes through with the holder's own attachment on the default
// box, and when its node dies it is fenced there and moves to the other
// node, attached to one node at a time. The list is in effect: a class
// pinned to the new box is refused naming it until a node's plugin,
// restarted with the list, reports the box; then it provisions there.
func TestAVolumeFromBeforeSeveralBoxesIsStillPublishedAndFenced(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{ControlPlane: framework.ControlPlaneOptions{NodeMonitorGracePeriod: fencedGrace}})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	ns := framework.TestNamespace
	framework.DeployFile(ctx, t, tl, e.CP, "manifests/overlays/storage-fencing/fencing-rbac.yaml")
	sim := e.StartSim(framework.SimOptions{})
	b := framework.StartSimProcess(t, tl, e.Root, e.Dir, "rds-b", 0)
	cfg := b.Box(4421)
	cfg.CommandTimeout = "5s"
	list := framework.WriteRDSConfig(t, e.Dir, cfg)
	nodeA, nodeB := e.NewNode("node-a"), e.NewNode("node-b")
	mon, err := framework.WatchAttachments(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	dep := framework.Deploy(ctx, t, tl, e.CP, e.Dir)
	bin := framework.BuildDriver(t, tl, e.Root)
	fencingArgs := []string{"--storage-fencing=allow-host", "--out-of-service-taint"}

	done := tl.Step("the driver serving one RDS, as before the list: a volume attached to node-a")
	d1 := framework.StartDriver(t, tl, bin, e.Dir, sim, dep, framework.DriverOptions{Name: "rds-csi-driver-one", ExtraArgs: fencingArgs})
	p1 := framework.StartProvisioner(t, tl, e.Root, e.Dir, d1, dep, framework.SidecarOptions{Name: "csi-provisioner-one"})
	a1 := framework.StartAttacher(t, tl, e.Root, e.Dir, d1, dep, framework.SidecarOptions{Name: "csi-attacher-one"})
	if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass("plain", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, framework.PVC(ns, "old", "plain", "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pvName string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC old bound", framework.PVCBound(c, ns, "old", &pvName)); err != nil {
		t.Fatal(err)
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	handle := pv.Spec.CSI.VolumeHandle
	if strings.Contains(handle, "/") {
		t.Fatalf("the one-box driver made volume handle %q: want one that names no box", handle)
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-a", "node-a", "old"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var va storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "old attached to node-a", framework.VolumeAttached(c, pvName, "node-a", &va)); err != nil {
		t.Fatal(err)
	}
	hostA := va.Status.AttachmentMetadata["hostNQN"]
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "the default box exports old to node-a's attachment alone", exportOf(sim, handle, hostA)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*framework.Process{a1, p1, d1.Process} {
		if err := p.Stop(30 * time.Second); err != nil {
			tl.Logf("stopping %d: %v", p.Pid(), err)
		}
	}
	done()

	done = tl.Step("the driver restarted with a list: the default box and rds-b")
	d2 := framework.StartDriver(t, tl, bin, e.Dir, sim, dep, framework.DriverOptions{Name: "rds-csi-driver-two", ExtraArgs: append(fencingArgs, "--rds-config="+list, "--rds-command-timeout=5s")})
	framework.StartProvisioner(t, tl, e.Root, e.Dir, d2, dep, framework.SidecarOptions{Name: "csi-provisioner-two"})
	framework.StartAttacher(t, tl, e.Root, e.Dir, d2, dep, framework.SidecarOptions{Name: "csi-attacher-two"})
	done()

	done = tl.Step("the old volume published again to node-a: its own attachment, on the default box")
	if err := framework.RepublishAttachment(ctx, c, va.Name); err != nil {
		t.Fatal(err)
	}
	var again storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "old attached to node-a again", framework.VolumeAttached(c, pvName, "node-a", &again)); err != nil {
		t.Fatal(err)
	}
	if got := again.Status.AttachmentMetadata["hostNQN"]; got != hostA {
		t.Errorf("node-a's attachment came back as %q, want its own %q", got, hostA)
	}
	if got := again.Status.AttachmentMetadata["nvmeAddress"]; got != sim.Host {
		t.Errorf("node-a's attachment points at %q, want the default box %s", got, sim.Host)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "the default box still exports old to node-a alone", exportOf(sim, handle, hostA)); err != nil {
		t.Fatal(err)
	}
	after, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.Spec.CSI.VolumeHandle != handle {
		t.Errorf("the PV's volume handle became %q, want %q", after.Spec.CSI.VolumeHandle, handle)
	}
	done()

	done = tl.Step("node-a stops: the old volume is fenced and moves to node-b")
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-b", "node-b", "old"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodeA.Fail()
	if _, err := framework.WaitFor(ctx, tl, fencedGrace+2*time.Minute, "node-a tainted out of service by the driver",
		framework.NodeTaint(c, "node-a", corev1.TaintNodeOutOfService, fencing.DriverOutOfServiceValue, true)); err != nil {
		t.Fatal(err)
	}
	var vaB storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "old attached to node-b", framework.VolumeAttached(c, pvName, "node-b", &vaB)); err != nil {
		t.Fatal(err)
	}
	hostB := vaB.Status.AttachmentMetadata["hostNQN"]
	if hostB == "" || hostB == hostA {
		t.Errorf("node-b's attachment host NQN %q: want its own, not node-a's %q", hostB, hostA)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "the default box exports old to node-b's attachment alone", exportOf(sim, handle, hostB)); err != nil {
		t.Fatal(err)
	}
	if got := mon.MaxAttached(pvName); got != 1 {
		t.Errorf("old was attached to %d nodes at once", got)
	}
	done()

	done = tl.Step("a class pinned to rds-b: refused naming rds-b until a node reports it, then provisioned there")
	if _, err := c.StorageV1().StorageClasses().Create(ctx, class("on-b", "rds-b", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, framework.PVC(ns, "new", "on-b", "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The nodes still carry what the one-box plugin registered: no node
	// reaches rds-b yet.
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC new refused naming rds-b", provisioningFailedWith(e, "new", "reaches none of RDS rds-b")); err != nil {
		t.Fatal(err)
	}
	// node-b's plugin restarted with the list (the upgrade's rollout
	// restart) registers again, as the kubelet registers it.
	plugin := framework.StartNodePlugin(t, tl, e.Dir, sim, framework.NodePluginOptions{Bin: bin, Node: "node-b", ExtraArgs: []string{"--rds-config=" + list}})
	_, node, conn, err := plugin.Clients()
	if err != nil {
		t.Fatal(err)
	}
	info, err := node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got := info.GetAccessibleTopology().GetSegments(); got[defaultBoxKey] != framework.RDSName || got[boxKeyPrefix+"rds-b"] != "true" {
		t.Fatalf("node-b's plugin with the list reports topology %v: want the default box's %s=%s and %srds-b=true", got, defaultBoxKey, framework.RDSName, boxKeyPrefix)
	}
	if err := nodeB.RegisterTopology(ctx, info); err != nil {
		t.Fatal(err)
	}
	var newPV string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC new bound", framework.PVCBound(c, ns, "new", &newPV)); err != nil {
		t.Fatal(err)
	}
	pvNew, err := c.CoreV1().PersistentVolumes().Get(ctx, newPV, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slot, ok := strings.CutPrefix(pvNew.Spec.CSI.VolumeHandle, "rds-b/")
	if !ok {
		t.Fatalf("PV %s: volume handle %q does not name rds-b", newPV, pvNew.Spec.CSI.VolumeHandle)
	}
	if _, err := b.Client(t).GetDisk(ctx, slot); err != nil {
		t.Errorf("rds-b has no disk %s: %v", slot, err)
	}
	done()
}

// provisioningFailedWith holds once a ProvisioningFailed event of the
// claim says want.
func provisioningFailedWith(e *framework.Env, claim, want string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		evs, err := e.Client.CoreV1().Events(framework.TestNamespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=" + claim,
		})
		if err != nil {
			return false, err.Error(), nil
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Reason == "ProvisioningFailed" && strings.Contains(ev.Message, want) {
				e.TL.Logf("PVC %s: %s: %s", claim, ev.Reason, ev.Message)
				return true, "", nil
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		return false, fmt.Sprintf("events %q", seen), nil
	}
}

// exportOf holds once the simulator exports the disk slot to host alone.
func exportOf(sim *framework.Sim, slot, host string) framework.Condition {
	return func(context.Context) (bool, string, error) {
		d, ok := sim.Disk(slot)
		if !ok {
			return false, "no disk", nil
		}
		return d.NVMeTCPExport && d.AllowHostName == host, fmt.Sprintf("nvme-tcp-export=%t allow-host=%q", d.NVMeTCPExport, d.AllowHostName), nil
	}
}
