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

	"github.com/srvlab/rds-csi/e2e/framework"
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
	w := startAttachWorldWith(t, attachOptions{grace: 40 * time.Second, fenced: true, cadence: framework.KubeletDefaultCadence,
		driverArgs: []string{"--storage-fencing=allow-host", "--out-of-service-taint"}}, "node-a", "node-b", "node-c")
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL

	done := tl.Step("the export is open to node-a's host alone")
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "export allows node-a only", diskExportTo(w, "node-a")); err != nil {
		t.Fatal(err)
	}
	host, err := framework.AttachmentHost(ctx, c, w.pv, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("kube-apiserver frozen for 60 s")
	resume, err := e.CP.FreezeAPIServer(tl)
	if err != nil {
		t.Fatal(err)
	}
	outage := time.NewTimer(60 * time.Second) // the fault's length, not a wait for anything
	for waiting := true; waiting; {
		select {
		case <-outage.C:
			waiting = false
		case <-time.After(time.Second):
			if err := exportHeld(w.sim, w.handle, host); err != nil {
				_ = resume()
				t.Fatalf("during the outage: %v", err)
			}
		}
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
	w := startAttachWorldWith(t, attachOptions{grace: 40 * time.Second, fenced: true, cadence: framework.KubeletDefaultCadence,
		driverArgs: []string{"--storage-fencing=allow-host", "--out-of-service-taint"}}, "node-a", "node-b", "node-c")
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "export allows node-a only", diskExportTo(w, "node-a")); err != nil {
		t.Fatal(err)
	}
	host, err := framework.AttachmentHost(ctx, c, w.pv, "node-a")
	if err != nil {
		t.Fatal(err)
	}
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
