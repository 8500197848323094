//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// exportHeld: the simulator's export of handle is open to host alone.
func exportHeld(sim *framework.Sim, handle, host string) error {
	if d, ok := sim.Disk(handle); !ok || !d.NVMeTCPExport || d.AllowHostName != host {
		return fmt.Errorf("the export of %s is exported=%t allow-host=%q, not node-a's attachment %s", handle, d.NVMeTCPExport, d.AllowHostName, host)
	}
	return nil
}

// exportUntouchedUntil holds once until has passed, failing the moment the
// export of handle is not open to host alone: the observation window after
// which a fence, if one were coming, would have come.
func exportUntouchedUntil(sim *framework.Sim, handle, host string, until time.Time) framework.Condition {
	return func(context.Context) (bool, string, error) {
		if err := exportHeld(sim, handle, host); err != nil {
			return false, "", err
		}
		left := time.Until(until)
		return left <= 0, fmt.Sprintf("export still open to node-a; %s of the window left", left.Round(time.Second)), nil
	}
}

// exportHeldFor checks every second, for d (a fault's length, not a wait
// for anything), that the export of handle stays open to host alone.
func exportHeldFor(sim *framework.Sim, handle, host string, d time.Duration) error {
	end := time.NewTimer(d)
	defer end.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-end.C:
			return exportHeld(sim, handle, host)
		case <-tick.C:
			if err := exportHeld(sim, handle, host); err != nil {
				return err
			}
		}
	}
}

// noFenceLogged fails t if a driver log of the test says it fenced.
func noFenceLogged(t *testing.T, dir string, drivers ...string) {
	t.Helper()
	for _, name := range drivers {
		log, err := os.ReadFile(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(log), "fenced stale attachment") {
			t.Errorf("%s fenced an attachment (%s.log)", name, name)
		}
	}
}

// Issue 23: an API server outage of 60 s fences nobody. Storage fencing
// with the driver's defaults (heartbeat and NotReady thresholds 20 s, the
// mass-outage guard), fake kubelets with a real kubelet's cadence (Lease
// every 10 s, Ready re-posted by their status sync), kube-controller-
// manager's default grace (40 s). Three nodes, the volume on node-a. The
// API server freezes for 60 s: every heartbeat looks stale at once, and
// when it answers again kube-controller-manager marks every node Unknown
// (measured before: the driver then closed the exports of all three
// nodes 16 s later). Nothing may be fenced: the export stays open to
// node-a's attachment through the outage and for the thresholds after it
// (the observation window: a fence comes, if it comes, within the
// thresholds after the API answers), its claim stays, no Fenced event.
func TestAPIServerOutageFencesNobody(t *testing.T) {
	t.Parallel()
	w, host := startHeartbeatWorld(t, framework.KubeletDefaultCadence, nil, "node-a", "node-b", "node-c")
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL

	done := tl.Step("kube-apiserver frozen for 60 s")
	resume, err := e.CP.FreezeAPIServer(tl)
	if err != nil {
		t.Fatal(err)
	}
	if err := exportHeldFor(w.sim, w.handle, host, 60*time.Second); err != nil {
		_ = resume()
		t.Fatalf("during the outage: %v", err)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	done()

	done = tl.Step("after the outage: every node Ready again, nothing fenced for the thresholds after")
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if _, err := framework.WaitFor(ctx, tl, time.Minute, n+" Ready", framework.NodeReady(c, n, corev1.ConditionTrue)); err != nil {
			t.Error(err)
		}
	}
	// The observation window: the heartbeat and NotReady thresholds (20 s
	// each) after the API answered, plus a margin.
	window := exportUntouchedUntil(w.sim, w.handle, host, resumed.Add(45*time.Second))
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "45 s after the outage with node-a's export untouched", window); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "claims name node-a only", framework.ClaimsAre(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	noFenceLogged(t, e.Dir, "rds-csi-driver")
	log, err := os.ReadFile(filepath.Join(e.Dir, "rds-csi-driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "mass-outage guard") {
			tl.Logf("driver: %s", line)
		}
	}
	done()
}

// Issue 23: one late kubelet renewal fences nobody. node-a (holding the
// volume) renews every 10 s; right after one renewal its kubelet stalls
// and renews next 16 s later instead of 10 (a late renewal, within the
// 20 s threshold). Its export and claim stay, and the driver logs no
// fence, through the threshold after the stall.
func TestLateRenewalFencesNobody(t *testing.T) {
	t.Parallel()
	w, host := startHeartbeatWorld(t, framework.KubeletDefaultCadence, nil, "node-a", "node-b", "node-c")
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL
	done := tl.Step("node-a's kubelet renews 16 s after its last renewal instead of 10")
	last, err := w.nodes["node-a"].NextRenewal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.nodes["node-a"].Fail()
	stall := time.NewTimer(time.Until(last.Add(16 * time.Second))) // the fault's length
	<-stall.C
	if err := w.nodes["node-a"].Recover(ctx); err != nil {
		t.Fatal(err)
	}
	done()
	done = tl.Step("nothing fenced through the threshold after the stall")
	window := exportUntouchedUntil(w.sim, w.handle, host, last.Add(25*time.Second))
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "the threshold after the stall with node-a's export untouched", window); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "claims name node-a only", framework.ClaimsAre(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	noFenceLogged(t, e.Dir, "rds-csi-driver")
	done()
}

// Issue 23: a leader failover fences nobody. Two replicas with storage
// fencing and the heartbeat on; three nodes at a real kubelet's cadence;
// the volume on node-a. The leader is SIGKILLed; the other replica takes
// over and times every node from what it has seen itself. node-a's
// export and claim stay, and neither replica logs a fence, through the
// thresholds after the takeover.
func TestLeaderFailoverFencesNobody(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{ControlPlane: framework.ControlPlaneOptions{NodeMonitorGracePeriod: 40 * time.Second}})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	sim := e.StartSim(framework.SimOptions{})
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		e.NewNodeWith(n, framework.KubeletDefaultCadence)
	}
	dep := framework.Deploy(ctx, t, tl, e.CP, e.Dir)
	framework.DeployFile(ctx, t, tl, e.CP, "manifests/overlays/storage-fencing/fencing-rbac.yaml")
	opts := func(name string) framework.ReplicaOptions {
		return framework.ReplicaOptions{Name: name, LeaderElection: framework.FastLeaderElection,
			DriverArgs: []string{"--storage-fencing=allow-host", "--out-of-service-taint"}}
	}
	a := e.StartReplica(sim, dep, opts("ctrl-a"))
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "ctrl-a holds the driver's, csi-provisioner's and csi-attacher's Leases",
		framework.LeasesHeldBy(c, dep.Namespace, "ctrl-a", 3)); err != nil {
		t.Fatal(err)
	}
	b := e.StartReplica(sim, dep, opts("ctrl-b"))
	pv, handle := provisionData(t, e, sim)
	if _, err := c.CoreV1().Pods(framework.TestNamespace).Create(ctx, framework.PodOnNode(framework.TestNamespace, "pod-a", "node-a", "data"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "volume attached to node-a", framework.VolumeAttached(c, pv, "node-a", nil)); err != nil {
		t.Fatal(err)
	}
	host, err := framework.AttachmentHost(ctx, c, pv, "node-a")
	if err != nil || host == "" {
		t.Fatalf("node-a's attachment host NQN: %q, %v", host, err)
	}

	done := tl.Step("SIGKILL the leader; ctrl-b takes over")
	a.Driver.Kill()
	took := time.Now()
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "ctrl-b reports rds_csi_leader 1", b.MetricEquals("rds_csi_leader", 1)); err != nil {
		t.Fatal(err)
	}
	done()
	done = tl.Step("nothing fenced through the thresholds after the takeover")
	window := exportUntouchedUntil(sim, handle, host, took.Add(45*time.Second))
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "45 s after the takeover with node-a's export untouched", window); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "claims name node-a only", framework.ClaimsAre(c, pv, "node-a")); err != nil {
		t.Error(err)
	}
	noFenceLogged(t, e.Dir, "rds-csi-driver-ctrl-a", "rds-csi-driver-ctrl-b")
	done()
}

// noTaintOn fails t if a node carries the out-of-service taint.
func noTaintOn(ctx context.Context, t *testing.T, tl *framework.Timeline, c kubernetes.Interface, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		if _, err := framework.WaitFor(ctx, tl, 5*time.Second, n+" not tainted out of service", framework.NodeTaint(c, n, corev1.TaintNodeOutOfService, "", false)); err != nil {
			t.Error(err)
		}
	}
}

// Issue 23: a crash and a rollout of the node plugin DaemonSet fence
// nobody. The heartbeat is the kubelet's own Lease, which goes on while
// the plugin is away; the driver must not read the plugin's absence as a
// node failure. Three nodes at a real kubelet's cadence, the driver's
// defaults with storage fencing, the volume on node-a. The plugin goes
// away on every node at once for 30 s (a crash of the DaemonSet's pods),
// comes back, then is replaced node by node, each away for 10 s (a
// rolling update): the kubelet deregisters it (CSINode driver and node ID
// annotation removed, as its plugin manager does; this tier runs no node
// plugin processes) and registers it again. node-a's export and claim
// stay, no node is tainted, and the driver logs no fence, through the
// thresholds after the last restart.
func TestNodePluginRolloutFencesNobody(t *testing.T) {
	t.Parallel()
	nodes := []string{"node-a", "node-b", "node-c"}
	w, host := startHeartbeatWorld(t, framework.KubeletDefaultCadence, nil, nodes...)
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL

	done := tl.Step("the node plugin crashes on every node at once: away for 30 s")
	for _, n := range nodes {
		if err := w.nodes[n].DeregisterPlugin(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := exportHeldFor(w.sim, w.handle, host, 30*time.Second); err != nil {
		t.Fatalf("while every node plugin was away: %v", err)
	}
	for _, n := range nodes {
		if err := w.nodes[n].RegisterPlugin(ctx); err != nil {
			t.Fatal(err)
		}
	}
	done()

	done = tl.Step("rolling update: each node's plugin replaced in turn, away for 10 s")
	for _, n := range nodes {
		if err := w.nodes[n].DeregisterPlugin(ctx); err != nil {
			t.Fatal(err)
		}
		if err := exportHeldFor(w.sim, w.handle, host, 10*time.Second); err != nil {
			t.Fatalf("while %s's plugin was away: %v", n, err)
		}
		if err := w.nodes[n].RegisterPlugin(ctx); err != nil {
			t.Fatal(err)
		}
	}
	restarted := time.Now()
	done()

	done = tl.Step("nothing fenced through the thresholds after the last restart")
	window := exportUntouchedUntil(w.sim, w.handle, host, restarted.Add(25*time.Second))
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "25 s after the last restart with node-a's export untouched", window); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "claims name node-a only", framework.ClaimsAre(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	noTaintOn(ctx, t, tl, c, nodes...)
	noFenceLogged(t, e.Dir, "rds-csi-driver")
	done()
}

// Issue 23: a flapping node is not fenced and unfenced in a loop. The
// opt-in fast heartbeat (kubelets renewing every 2.5 s, --heartbeat-
// threshold=6s); node-a holds one volume, node-b another, node-c is
// healthy. node-b's kubelet stalls for 10 s (past the threshold, short of
// kube-controller-manager's 40 s grace: its Ready condition stays True),
// renews for 5 s, and stalls again, three times. Its first lapse fences
// it: its volume is cut off and released, and the driver taints it out of
// service. Hysteresis: the taint stays, the same one (its timeAdded
// unchanged), through every return shorter than the recovery period
// (20 s), each return after the first counts in rds_csi_node_flaps_total,
// and the driver lifts the taint only once node-b has renewed for the
// recovery period. node-a's export and claim are untouched throughout,
// and the driver fences once: node-b's volume, at the first lapse.
func TestFlappingNodeIsNotFencedInALoop(t *testing.T) {
	t.Parallel()
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	w, host := startHeartbeatWorld(t, framework.KubeletFastHeartbeatCadence,
		[]string{"--heartbeat-threshold=6s", fmt.Sprintf("--http-endpoint=127.0.0.1:%d", port)}, "node-a", "node-b", "node-c")
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL
	// node-b holds a volume: a node holding none is not fenced, and only a
	// fence taints.
	if _, err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Create(ctx,
		framework.PVC(framework.TestNamespace, "data-b", "rds", "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pvB string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC e2e/data-b bound", framework.PVCBound(c, framework.TestNamespace, "data-b", &pvB)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods(framework.TestNamespace).Create(ctx, framework.PodOnNode(framework.TestNamespace, "pod-b", "node-b", "data-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "data-b attached to node-b", framework.VolumeAttached(c, pvB, "node-b", nil)); err != nil {
		t.Fatal(err)
	}
	flaps := func() float64 {
		v, err := framework.ScrapeMetric(ctx, metrics, "rds_csi_node_flaps_total")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := flaps()
	b := w.nodes["node-b"]
	var tainted *metav1.Time
	const lapses = 3
	for i := 1; i <= lapses; i++ {
		done := tl.Step(fmt.Sprintf("node-b's kubelet stalls for 10 s (lapse %d of %d)", i, lapses))
		b.Fail()
		if err := exportHeldFor(w.sim, w.handle, host, 10*time.Second); err != nil {
			t.Fatalf("while node-b stalled: %v", err)
		}
		if i == 1 {
			if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "node-b tainted out of service by the driver",
				framework.NodeTaint(c, "node-b", corev1.TaintNodeOutOfService, fencing.DriverOutOfServiceValue, true)); err != nil {
				t.Fatal(err)
			}
			tainted = driverTaintAdded(ctx, t, c, "node-b")
		}
		if err := b.Recover(ctx); err != nil {
			t.Fatal(err)
		}
		done()
		if i == lapses {
			break
		}
		done = tl.Step("node-b renews for 5 s, less than the recovery period")
		if err := exportHeldFor(w.sim, w.handle, host, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if got := driverTaintAdded(ctx, t, c, "node-b"); got == nil || !got.Equal(tainted) {
			t.Fatalf("node-b's taint after return %d: added %v, want the first one (added %v): the driver untainted and tainted it again", i, got, tainted)
		}
		done()
	}

	done := tl.Step("node-b steady: counted as flapping, its taint lifted after the recovery period")
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "rds_csi_node_flaps_total up by 2 (the returns after the first)", func(ctx context.Context) (bool, string, error) {
		v := flaps()
		return v-before >= lapses-1, fmt.Sprintf("rds_csi_node_flaps_total %g (was %g)", v, before), nil
	}); err != nil {
		t.Error(err)
	}
	if got := driverTaintAdded(ctx, t, c, "node-b"); got != nil && !got.Equal(tainted) {
		t.Errorf("node-b's taint after the last return: added %v, want the first one (added %v)", got, tainted)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-b's out-of-service taint lifted by the driver", framework.NodeTaint(c, "node-b", corev1.TaintNodeOutOfService, "", false)); err != nil {
		t.Error(err)
	}
	if err := exportHeld(w.sim, w.handle, host); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "claims name node-a only", framework.ClaimsAre(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	noTaintOn(ctx, t, tl, c, "node-a", "node-c")
	log, err := os.ReadFile(filepath.Join(e.Dir, "rds-csi-driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	var fences []string
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "fenced stale attachment") {
			fences = append(fences, line)
		}
	}
	if len(fences) != 1 || !strings.Contains(fences[0], `node="node-b"`) || !strings.Contains(fences[0], pvB) {
		t.Errorf("the driver fenced %d times, want once (node-b's %s at its first lapse): %q", len(fences), pvB, fences)
	}
	done()
}

// driverTaintAdded is when the driver's out-of-service taint on node was
// added (nil: none).
func driverTaintAdded(ctx context.Context, t *testing.T, c kubernetes.Interface, node string) *metav1.Time {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, taint := range n.Spec.Taints {
		if taint.Key == corev1.TaintNodeOutOfService && taint.Value == fencing.DriverOutOfServiceValue {
			return taint.TimeAdded
		}
	}
	return nil
}

// startHeartbeatWorld starts an attach world with storage fencing and the
// out-of-service taint, kube-controller-manager at its default 40 s grace
// and the fake kubelets at cadence, and waits until the export is open to
// node-a's attachment alone; it returns that attachment's host NQN.
func startHeartbeatWorld(t *testing.T, cadence framework.KubeletCadence, extraArgs []string, nodes ...string) (*attachWorld, string) {
	t.Helper()
	args := append([]string{"--storage-fencing=allow-host", "--out-of-service-taint"}, extraArgs...)
	w := startAttachWorldWith(t, attachOptions{grace: 40 * time.Second, fenced: true, cadence: cadence, driverArgs: args}, nodes...)
	e := w.e
	done := e.TL.Step("the export is open to node-a's host alone")
	if _, err := framework.WaitFor(e.Ctx, e.TL, 10*time.Second, "export allows node-a only", diskExportTo(w, "node-a")); err != nil {
		t.Fatal(err)
	}
	host, err := framework.AttachmentHost(e.Ctx, e.Client, w.pv, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	done()
	return w, host
}
