//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/nodelease"
)

// fencedGrace is kube-controller-manager's --node-monitor-grace-period in
// the unattended failover: hack/controlplane.sh's default (Kubernetes'
// own is 50s; BENCHMARKS.md adds the difference).
const fencedGrace = 20 * time.Second

// diskExport is the simulator's export of a volume, as a condition.
func diskExport(w *attachWorld, exported bool, host string) framework.Condition {
	return func(context.Context) (bool, string, error) {
		d, ok := w.sim.Disk(w.handle)
		if !ok {
			return false, "no disk", nil
		}
		state := fmt.Sprintf("nvme-tcp-export=%t allow-host=%q", d.NVMeTCPExport, d.AllowHostName)
		return d.NVMeTCPExport == exported && (!exported || d.AllowHostName == host), state, nil
	}
}

// diskExportTo: the simulator's export of the volume is open to node's
// attachment alone (the host NQN the driver gave that attachment, as its
// VolumeAttachment records it).
func diskExportTo(w *attachWorld, node string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		host, err := framework.AttachmentHost(ctx, w.e.Client, w.pv, node)
		if err != nil || host == "" {
			return false, fmt.Sprintf("no attachment host NQN for %s yet (%v)", node, err), nil
		}
		return diskExport(w, true, host)(ctx)
	}
}

// Unattended failover (issues 12 and 23): storage fencing on, the
// driver's defaults otherwise (--heartbeat-threshold and
// --not-ready-threshold 20s with it) plus --out-of-service-taint. node-a's
// kubelet stops, and with no operator action at all: the driver sees its
// Lease unrenewed for the threshold (kube-controller-manager marks node-a
// Unknown about then, after its 20 s grace) and fences it, cutting its
// host off the RDS (export closed) before releasing its claim, then taints
// it out of service;
// Kubernetes evicts and garbage-collects pod-a and detaches node-a's
// volume; node-b's waiting pod gets the volume, exported to node-b's host
// NQN alone. When node-a comes back the driver removes its taint.
func TestUnattendedFailover(t *testing.T) {
	t.Parallel()
	unattendedFailover(t, attachOptions{grace: fencedGrace, fenced: true,
		driverArgs: []string{"--storage-fencing=allow-host", "--out-of-service-taint"}})
}

// The same with a real kubelet's cadence (Lease every 10 s, Ready re-posted
// every 10 s) and kube-controller-manager's default grace (40 s): what a
// cluster with Kubernetes' defaults gets (issue 23's figure; docs/
// BENCHMARKS.md records its UNATTENDED FAILOVER line).
func TestUnattendedFailoverKubeletCadence(t *testing.T) {
	t.Parallel()
	unattendedFailover(t, attachOptions{grace: 40 * time.Second, fenced: true, cadence: framework.KubeletDefaultCadence,
		driverArgs: []string{"--storage-fencing=allow-host", "--out-of-service-taint"}})
}

// The recommended set-up at a real kubelet's cadence (issue 38): the same,
// with each node plugin renewing its own Lease (pkg/nodelease, at its
// default duration) and the driver reading them (--node-lease-namespace),
// as the storage-fencing component installs it. node-a's power loss stops
// both. docs/BENCHMARKS.md's headline failover figure.
func TestUnattendedFailoverKubeletCadenceWithPluginLeases(t *testing.T) {
	t.Parallel()
	unattendedFailover(t, attachOptions{grace: 40 * time.Second, fenced: true, cadence: framework.KubeletDefaultCadence,
		pluginLease: nodelease.DefaultDuration,
		driverArgs:  []string{"--storage-fencing=allow-host", "--out-of-service-taint", "--node-lease-namespace=" + driverNamespace}})
}

// Opt-in faster failover (issue 23): the kubelets renew their Leases every
// 2.5 s (nodeLeaseDurationSeconds: 10, the status sync at its default
// 10 s), and so do the node plugins theirs (--node-lease-duration=10s);
// the driver runs --heartbeat-threshold=6s (two renewals and a bit),
// kube-controller-manager its default grace (40 s). The node's power loss
// stops both. A benchmark like the one above (docs/BENCHMARKS.md), not a
// timed test.
func TestUnattendedFailoverFastHeartbeat(t *testing.T) {
	t.Parallel()
	unattendedFailover(t, attachOptions{grace: 40 * time.Second, fenced: true, cadence: framework.KubeletFastHeartbeatCadence,
		pluginLease: 10 * time.Second,
		driverArgs:  []string{"--storage-fencing=allow-host", "--out-of-service-taint", "--heartbeat-threshold=6s", "--node-lease-namespace=" + driverNamespace}})
}

// lastRenewals reads node's heartbeat Leases once both have stopped: the
// renewTime each writer stamped last (on this machine's clock, as the
// test's), the kubelet's and, when plugin, its node plugin's.
func lastRenewals(t *testing.T, w *attachWorld, node string, plugin bool) (kubelet, nodePlugin time.Time) {
	t.Helper()
	ctx, c := w.e.Ctx, w.e.Client
	l, err := c.CoordinationV1().Leases("kube-node-lease").Get(ctx, node, metav1.GetOptions{})
	if err != nil || l.Spec.RenewTime == nil {
		t.Fatalf("%s's kubelet Lease: %v", node, err)
	}
	kubelet = l.Spec.RenewTime.Time
	if plugin {
		name, _ := nodelease.Name(node)
		l, err := c.CoordinationV1().Leases(driverNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			t.Fatalf("%s's node plugin Lease: %v", node, err)
		}
		nodePlugin = l.Spec.RenewTime.Time
	}
	return kubelet, nodePlugin
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func unattendedFailover(t *testing.T, o attachOptions) {
	w := startAttachWorldWith(t, o, "node-a", "node-b")
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL
	ns := framework.TestNamespace

	done := tl.Step("the export is open to node-a's host alone")
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "export allows node-a only", diskExportTo(w, "node-a")); err != nil {
		t.Fatal(err)
	}
	done()

	stopPlugin := startNodeLeases(t, e, o.pluginLease, "node-a", "node-b")

	w.replacementWaits(t)

	// A node dies at any moment of its heartbeats' renewal cycles: a
	// random part of its kubelet's interval after one of its renewals.
	// The steps before take about as long in every run, and
	// startNodeLeases returns just after a renewal: without this the node
	// plugin's last renewal came well under 1 s before the stop in every
	// run, one phase measured, not failover. Counting from a renewal seen
	// now also keeps the driver's own start out of the figure: it times
	// nothing from before its Lease watch opened, and a node stopped soon
	// after would be cut up to that much later.
	done = tl.Step("node-a runs on for a random part of its kubelet's renewal interval after its next renewal")
	if _, err := w.nodes["node-a"].NextRenewal(ctx); err != nil {
		t.Fatal(err)
	}
	delay := rand.N(w.nodes["node-a"].Cadence().Renew)
	tl.Logf("node-a renewed; it stops %s later", delay.Round(time.Millisecond))
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	done()

	done = tl.Step("node-a stops; nobody acts")
	t0 := time.Now()
	stopPlugin["node-a"]()
	w.nodes["node-a"].Fail()
	lastKubelet, lastPlugin := lastRenewals(t, w, "node-a", o.pluginLease > 0)
	cut, err := framework.WaitFor(ctx, tl, o.grace+2*time.Minute, "node-a cut off the RDS (export closed or moved on)",
		framework.AnyOf(diskExport(w, false, ""), diskExportTo(w, "node-b")))
	if err != nil {
		t.Fatal(err)
	}
	tainted, err := framework.WaitFor(ctx, tl, time.Minute, "node-a tainted out of service by the driver", framework.NodeTaint(c, "node-a", corev1.TaintNodeOutOfService, fencing.DriverOutOfServiceValue, true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "volume attached to node-b", framework.VolumeAttached(c, w.pv, "node-b", nil)); err != nil {
		t.Fatal(err)
	}
	var at time.Time
	if _, err := framework.WaitFor(ctx, tl, 30*time.Second, "the VolumeAttachment watch saw it attached to node-b", w.mon.SeenAttached(w.pv, "node-b", t0, &at)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "export allows node-b only", diskExportTo(w, "node-b")); err != nil {
		t.Error(err)
	}
	tl.Logf("UNATTENDED FAILOVER: node stop -> attached on node-b %s (cut off the RDS after %s, tainted %s after the cut, attached %s after the taint; fake kubelet Lease of %s every %s, kube-controller-manager --node-monitor-grace-period=%s, driver %v, thresholds 20s unless given)",
		at.Sub(t0).Round(time.Millisecond), cut.Round(time.Millisecond), tainted.Round(time.Millisecond),
		at.Sub(t0).Round(time.Millisecond)-cut.Round(time.Millisecond)-tainted.Round(time.Millisecond), w.nodes["node-a"].Cadence().Duration, w.nodes["node-a"].Cadence().Renew, o.grace, o.driverArgs)
	renewals := fmt.Sprintf("last renewals before the stop: kubelet %s", t0.Sub(lastKubelet).Round(time.Millisecond))
	later := lastKubelet
	if !lastPlugin.IsZero() {
		renewals += fmt.Sprintf(", node plugin %s", t0.Sub(lastPlugin).Round(time.Millisecond))
		later = latest(lastKubelet, lastPlugin)
	}
	tl.Logf("UNATTENDED FAILOVER RENEWALS: %s; cut %s after the later one", renewals, t0.Add(cut).Sub(later).Round(time.Millisecond))
	done()

	if got := w.mon.MaxAttached(w.pv); got != 1 {
		t.Errorf("PV %s was attached to %d nodes at once; history %+v", w.pv, got, w.mon.History(w.pv))
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "claims name node-b only", framework.ClaimsAre(c, w.pv, "node-b")); err != nil {
		t.Error(err)
	}
	var ev corev1.Event
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "the driver's Fenced event for node-a",
		framework.EventOn(c, ns, "PersistentVolumeClaim", "data", framework.ReasonFenced, &ev, w.handle, "node-a")); err != nil {
		t.Error(err)
	} else {
		tl.Logf("driver: %s: %s", ev.Reason, ev.Message)
	}

	done = tl.Step("node-a comes back: the driver removes its taint")
	if err := w.nodes["node-a"].Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-a's out-of-service taint removed", framework.NodeTaint(c, "node-a", corev1.TaintNodeOutOfService, "", false)); err != nil {
		t.Error(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "export still allows node-b only", diskExportTo(w, "node-b")); err != nil {
		t.Error(err)
	}
	done()
}
