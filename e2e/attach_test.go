//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// attachWorld is a control plane with the driver's controller, the
// simulator, fake kubelets, and a bound claim "data" whose pod runs on
// node-a with the volume attached there.
type attachWorld struct {
	e      *framework.Env
	sim    *framework.Sim
	nodes  map[string]*framework.FakeKubelet
	mon    *framework.AttachmentMonitor
	pv     string
	handle string
	vaA    storagev1.VolumeAttachment
}

// nodeMonitorGrace is kube-controller-manager's --node-monitor-grace-period
// in the failure scenarios: a stopped fake kubelet turns Unknown after it.
const nodeMonitorGrace = 8 * time.Second

func startAttachWorld(t *testing.T, nodes ...string) *attachWorld {
	t.Helper()
	return startAttachWorldWith(t, attachOptions{grace: nodeMonitorGrace}, nodes...)
}

// attachOptions vary the attach world: kube-controller-manager's
// --node-monitor-grace-period, and storage fencing (the driver runs with
// extra args, and the storage-fencing component's RBAC is applied).
type attachOptions struct {
	grace      time.Duration
	fenced     bool
	driverArgs []string
	// cadence of the fake kubelets (zero: framework.FastCadence).
	cadence framework.KubeletCadence
	// nodeIDs: node IDs other than the name that nodes' plugins
	// register, by node (registered before the first attach).
	nodeIDs map[string]string
	// pluginLease: each node plugin renews its own Lease of this duration
	// (zero: none), and a node that stops stops it too.
	pluginLease time.Duration
}

// provisionData creates the StorageClass "rds" and a 1Gi RWO PVC e2e/data,
// waits until it is bound, and returns its PV and the volume handle, whose
// disk must be on the simulator.
func provisionData(t *testing.T, e *framework.Env, sim *framework.Sim) (pvName, handle string) {
	t.Helper()
	ctx, c, tl := e.Ctx, e.Client, e.TL
	if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass("rds", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Create(ctx,
		framework.PVC(framework.TestNamespace, "data", "rds", "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC e2e/data bound", framework.PVCBound(c, framework.TestNamespace, "data", &pvName)); err != nil {
		t.Fatal(err)
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	handle = pv.Spec.CSI.VolumeHandle
	if _, ok := sim.Disk(handle); !ok {
		t.Fatalf("no disk %s on the simulator; disks: %+v", handle, sim.Disks())
	}
	return pvName, handle
}

func startAttachWorldWith(t *testing.T, o attachOptions, nodes ...string) *attachWorld {
	t.Helper()
	e := framework.NewEnv(t, framework.EnvOptions{ControlPlane: framework.ControlPlaneOptions{NodeMonitorGracePeriod: o.grace}})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	w := &attachWorld{e: e, nodes: map[string]*framework.FakeKubelet{}}
	w.sim = e.StartSim(framework.SimOptions{})
	cadence := o.cadence
	if cadence.Renew == 0 {
		cadence = framework.FastCadence
	}
	for _, n := range nodes {
		w.nodes[n] = e.NewNodeWith(n, cadence)
		if id, ok := o.nodeIDs[n]; ok {
			if err := w.nodes[n].SetNodeID(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	var err error
	if w.mon, err = framework.WatchAttachments(ctx, c); err != nil {
		t.Fatal(err)
	}
	if o.fenced {
		framework.DeployFile(ctx, t, tl, e.CP, "manifests/overlays/storage-fencing/fencing-rbac.yaml")
	}
	e.StartController(w.sim, framework.ControllerOptions{DriverArgs: o.driverArgs})

	done := tl.Step("StorageClass + 1Gi RWO PVC e2e/data")
	w.pv, w.handle = provisionData(t, e, w.sim)
	done()

	done = tl.Step("pod-a on node-a: the attach/detach controller asks, csi-attacher publishes")
	if _, err := c.CoreV1().Pods(framework.TestNamespace).Create(ctx, framework.PodOnNode(framework.TestNamespace, "pod-a", "node-a", "data"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "volume attached to node-a", framework.VolumeAttached(c, w.pv, "node-a", &w.vaA)); err != nil {
		t.Fatal(err)
	}
	done()
	return w
}

// Scenario 1 (attach) and 2 (a second node refused): the claim's pod on
// node-a gets the volume attached through csi-attacher and the driver's
// ControllerPublishVolume, with the publish_context a node needs to
// connect to the volume's NVMe/TCP export and the decision recorded on the
// PV; a pod on node-b for the same RWO claim is refused by Kubernetes'
// Multi-Attach check, a VolumeAttachment that bypasses that check is
// refused by the driver (FAILED_PRECONDITION naming node-a), and nothing
// is attached to node-b at any moment.
func TestAttachAndRefuseSecondNode(t *testing.T) {
	t.Parallel()
	w := startAttachWorld(t, "node-a", "node-b")
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL
	ns := framework.TestNamespace

	// Scenario 1: what node-a got.
	disk, _ := w.sim.Disk(w.handle)
	if !disk.NVMeTCPExport {
		t.Errorf("disk %s is not exported over NVMe/TCP on the simulator: %+v", w.handle, disk)
	}
	if w.vaA.Spec.Attacher != framework.DriverName {
		t.Errorf("VolumeAttachment %s attacher %q, want %q", w.vaA.Name, w.vaA.Spec.Attacher, framework.DriverName)
	}
	want := map[string]string{
		"nvmeAddress": w.sim.Host,
		"nvmePort":    "4420",
		"nqn":         disk.NVMeTCPNQN,
	}
	if disk.NVMeTCPNQN == "" || !strings.HasSuffix(disk.NVMeTCPNQN, w.handle) {
		t.Errorf("simulator disk %s NQN %q does not name the volume", w.handle, disk.NVMeTCPNQN)
	}
	if got := w.vaA.Status.AttachmentMetadata; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("publish_context (VolumeAttachment %s attachmentMetadata) = %v, want %v", w.vaA.Name, got, want)
	}
	tl.Logf("publish_context of node-a: %v", w.vaA.Status.AttachmentMetadata)
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "claims annotation names node-a", framework.ClaimsAre(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "driver's Attached event on the PVC",
		framework.EventOn(c, ns, "PersistentVolumeClaim", "data", "Attached", nil, w.handle, "node-a")); err != nil {
		t.Error(err)
	}

	// Scenario 2, Kubernetes' own check: the attach/detach controller
	// does not even create a VolumeAttachment for node-b.
	done := tl.Step("pod-b on node-b with the same RWO claim")
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-b", "node-b", "data"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ev corev1.Event
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "Multi-Attach error on pod-b",
		framework.EventOn(c, ns, "Pod", "pod-b", "FailedAttachVolume", &ev, "Multi-Attach")); err != nil {
		t.Fatal(err)
	}
	tl.Logf("pod-b: %s: %s", ev.Reason, ev.Message)
	if err := framework.NotAttachedTo(ctx, c, w.pv, w.handle, "node-b"); err != nil {
		t.Error(err)
	}
	done()

	// Scenario 2, the driver's check: a VolumeAttachment for node-b made
	// directly (a second attacher, or a race with the Multi-Attach check)
	// reaches ControllerPublishVolume, which refuses it.
	done = tl.Step("a VolumeAttachment for node-b that bypasses Multi-Attach")
	if _, err := framework.CreateVolumeAttachment(ctx, c, "e2e-bypass-node-b", w.pv, "node-b"); err != nil {
		t.Fatal(err)
	}
	var vaB storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "node-b's VolumeAttachment refused by the driver",
		framework.AttachRefused(c, w.pv, "node-b", &vaB, "FailedPrecondition", "node-a")); err != nil {
		t.Fatal(err)
	}
	tl.Logf("node-b attach error: %s", vaB.Status.AttachError.Message)
	// The observation window: csi-attacher retries a refused publish with
	// a growing backoff (1 s, 2 s, ... capped at 5 s); the window ends when
	// the driver has refused it three times, so it spans at least one
	// backoff retry. Each refusal is an AttachConflict event on the claim.
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "the driver refused node-b at least 3 times (AttachConflict events)",
		func(ctx context.Context) (bool, string, error) {
			n, err := framework.EventCount(ctx, c, ns, "PersistentVolumeClaim", "data", framework.ReasonAttachConflict)
			if err != nil {
				return false, err.Error(), nil
			}
			return n >= 3, "AttachConflict count " + strconv.Itoa(int(n)), nil
		}); err != nil {
		t.Fatal(err)
	}
	if err := framework.NotAttachedTo(ctx, c, w.pv, w.handle, "node-b"); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "claims still name node-a only", framework.ClaimsAre(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	if err := c.StorageV1().VolumeAttachments().Delete(ctx, "e2e-bypass-node-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-b's VolumeAttachment gone", framework.NoVolumeAttachment(c, w.pv, "node-b")); err != nil {
		t.Fatal(err)
	}
	// Detaching what node-b never had leaves node-a's attachment alone.
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "node-a still attached", framework.VolumeAttached(c, w.pv, "node-a", nil)); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "claims still name node-a only", framework.ClaimsAre(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	done()

	for _, h := range w.mon.History(w.pv) {
		for _, n := range h.Nodes {
			if n != "node-a" {
				t.Errorf("PV %s was attached to %v at %s", w.pv, h.Nodes, h.At.Format(time.RFC3339Nano))
			}
		}
	}
	if got := w.mon.MaxAttached(w.pv); got != 1 {
		t.Errorf("PV %s was attached to %d nodes at once, want 1", w.pv, got)
	}
}

// Scenario 3a: node-a is shut down (its kubelet stops, the node lifecycle
// controller marks it Unknown) and the operator taints it
// node.kubernetes.io/out-of-service. The volume moves to the replacement
// pod on node-b without ever being attached to both.
func TestFailoverOutOfService(t *testing.T) {
	t.Parallel()
	testFailover(t, "out-of-service taint on node-a", func(w *attachWorld) error {
		return w.nodes["node-a"].Taint(w.e.Ctx, framework.OutOfServiceTaint)
	}, func(w *attachWorld) error {
		// The taint eviction controller evicts pod-a (it does not tolerate
		// the taint); with no kubelet it stays Terminating until the pod
		// GC force-deletes it (terminating pods on out-of-service nodes),
		// which the test does in its place.
		_, err := framework.WaitFor(w.e.Ctx, w.e.TL, time.Minute, "pod-a evicted", framework.PodTerminating(w.e.Client, framework.TestNamespace, "pod-a"))
		if err != nil {
			return err
		}
		return framework.ForceDeletePod(w.e.Ctx, w.e.Client, framework.TestNamespace, "pod-a")
	})
}

// Scenario 3b: node-a is dead and its Node object is deleted (cluster
// autoscaler, kubectl delete node).
func TestFailoverNodeDeleted(t *testing.T) {
	t.Parallel()
	testFailover(t, "Node node-a deleted", func(w *attachWorld) error {
		return w.e.Client.CoreV1().Nodes().Delete(w.e.Ctx, "node-a", metav1.DeleteOptions{})
	}, func(w *attachWorld) error {
		// The pod GC deletes pods of a deleted node after a 40 s
		// quarantine; the test does it at once in its place.
		return framework.ForceDeletePod(w.e.Ctx, w.e.Client, framework.TestNamespace, "pod-a")
	})
}

// replacementWaits creates pod-b on node-b for the claim pod-a on node-a
// holds, and waits for Kubernetes' Multi-Attach refusal.
func (w *attachWorld) replacementWaits(t *testing.T) {
	t.Helper()
	ctx, c, tl, ns := w.e.Ctx, w.e.Client, w.e.TL, framework.TestNamespace
	done := tl.Step("replacement pod-b on node-b waits (Multi-Attach)")
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-b", "node-b", "data"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "Multi-Attach error on pod-b",
		framework.EventOn(c, ns, "Pod", "pod-b", "FailedAttachVolume", nil, "Multi-Attach")); err != nil {
		t.Fatal(err)
	}
	done()
}

// testFailover: pod-a holds the claim on node-a and its replacement pod-b
// waits on node-b (refused by Multi-Attach). node-a's kubelet stops, the
// node turns Unknown, then fail (the failure action the time is measured
// from) and podGC (what Kubernetes would do to pod-a) run. The volume must
// end up attached to node-b, never to both nodes at once according to the
// API server's VolumeAttachment history, with the driver having fenced
// node-a's stale attachment (or handed it off) and the PV's claims naming
// only node-b.
func testFailover(t *testing.T, what string, fail, podGC func(*attachWorld) error) {
	w := startAttachWorld(t, "node-a", "node-b")
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL
	ns := framework.TestNamespace

	w.replacementWaits(t)

	done := tl.Step("node-a's kubelet stops")
	w.nodes["node-a"].Fail()
	if _, err := framework.WaitFor(ctx, tl, nodeMonitorGrace+time.Minute, "node-a Unknown", framework.NodeReady(c, "node-a", corev1.ConditionUnknown)); err != nil {
		t.Fatal(err)
	}
	// NotReady alone moves nothing (no --not-ready-threshold).
	if err := framework.NotAttachedTo(ctx, c, w.pv, w.handle, "node-b"); err != nil {
		t.Error(err)
	}
	done()

	done = tl.Step(what)
	t0 := time.Now()
	if err := fail(w); err != nil {
		t.Fatal(err)
	}
	if err := podGC(w); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "volume attached to node-b", framework.VolumeAttached(c, w.pv, "node-b", nil)); err != nil {
		t.Fatal(err)
	}
	var at time.Time
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "the VolumeAttachment watch saw it attached to node-b", w.mon.SeenAttached(w.pv, "node-b", t0, &at)); err != nil {
		t.Fatal(err)
	}
	failover := at.Sub(t0)
	tl.Logf("FAILOVER %s: %s from the failure action to attached on node-b", what, failover.Round(time.Millisecond))
	done()

	if got := w.mon.MaxAttached(w.pv); got != 1 {
		t.Errorf("PV %s was attached to %d nodes at once; history %+v", w.pv, got, w.mon.History(w.pv))
	}
	if gap, ok := w.mon.Handoff(w.pv, "node-a", "node-b"); ok {
		tl.Logf("handoff gap node-a -> node-b: %s", gap.Round(time.Millisecond))
	} else {
		t.Errorf("no handoff node-a -> node-b in the VolumeAttachment history %+v", w.mon.History(w.pv))
	}
	var ev corev1.Event
	// Either the driver fenced node-a's claim, or the attach/detach
	// controller's detach of node-a (after the taint or the deletion)
	// released it first; node-b attached only after that detach completed.
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "the driver fenced node-a or detached it",
		framework.AnyOf(
			framework.EventOn(c, ns, "PersistentVolumeClaim", "data", framework.ReasonFenced, &ev, w.handle, "node-a"),
			framework.EventOn(c, ns, "PersistentVolumeClaim", "data", framework.ReasonDetached, &ev, w.handle, "node-a"),
		)); err != nil {
		t.Error(err)
	} else {
		tl.Logf("driver: %s: %s", ev.Reason, ev.Message)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "claims name node-b only", framework.ClaimsAre(c, w.pv, "node-b")); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-a's VolumeAttachment gone", framework.NoVolumeAttachment(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	if _, ok := w.sim.Disk(w.handle); !ok {
		t.Errorf("disk %s gone from the simulator after the failover", w.handle)
	}
}
