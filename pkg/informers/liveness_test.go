package informers

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// claimed puts one claimed, attached volume per node.
func (h *harness) claimed(nodes ...string) {
	h.t.Helper()
	for i, n := range nodes {
		pvName := "pv-" + n
		h.put(pv(pvName, "vol-"+n, corev1.ReadWriteOnce, `{"`+n+`":"2026-11-22T12:00:00Z"}`), va("va-"+n, pvName, n, true, t0))
		_ = i
	}
}

func (h *harness) fencedNodes() []string {
	var out []string
	for _, s := range h.react.stale {
		out = append(out, s.Node+"/"+string(s.Reason))
	}
	return out
}

// A NotReady condition whose LastTransitionTime is long past (as
// kube-controller-manager stamps every node after an API server outage)
// is timed from when this controller saw it, not from the stamp. Before,
// the threshold was counted from the stamp and the node was fenced at
// once.
func TestNotReadyTimedOnTheControllersClock(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.NotReadyThreshold = 20 * time.Second
	h := newHarness(t, policy)
	h.put(node("node-a", true, t0), node("node-b", true, t0), node("node-c", true, t0))
	h.claimed("node-a")
	h.put(node("node-a", false, h.clock.Now().Add(-time.Hour)))
	if got := h.fencedNodes(); len(got) != 0 {
		t.Fatalf("fenced %v the moment it was seen NotReady (its condition says since an hour)", got)
	}
	if s := h.index.Node("node-a"); !s.NotReadySeen.Equal(h.clock.Now()) {
		t.Fatalf("NotReadySeen %v; want now %v", s.NotReadySeen, h.clock.Now())
	}
	h.clock.Step(20*time.Second + 2*time.Millisecond)
	h.next(h.c.queue)
	if got := h.fencedNodes(); len(got) != 1 || got[0] != "node-a/NotReady" {
		t.Fatalf("after the threshold on the controller's clock: fenced %v; want node-a/NotReady", got)
	}
}

// Most nodes failing together (an API server outage, a partition between
// the nodes and the API server) holds every timed fence: none of them is
// fenced, the guard reports it, and when it lets go a node still NotReady
// is timed from then.
func TestGuardHoldsWhenMostNodesFailTogether(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.NotReadyThreshold = 20 * time.Second
	var events []fencing.GuardEvent
	h := newHarnessLive(t, Config{Policy: policy}, fencing.LivenessConfig{OnGuard: func(e fencing.GuardEvent) { events = append(events, e) }})
	h.put(node("node-a", true, t0), node("node-b", true, t0), node("node-c", true, t0))
	h.claimed("node-a", "node-b", "node-c")
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		h.put(node(n, false, h.clock.Now()))
	}
	// Two of three NotReady together are more than the share (0.55).
	if len(events) != 1 || !events[0].Holding || events[0].Suspect != 2 || events[0].Total != 3 {
		t.Fatalf("guard events %+v; want one holding, from 2 of 3 suspect", events)
	}
	h.clock.Step(time.Minute)
	h.next(h.c.queue)
	if got := h.fencedNodes(); len(got) != 0 {
		t.Fatalf("fenced %v while every node was NotReady together", got)
	}
	// Two come back: the guard lets go; node-c, still NotReady, is timed
	// from that moment.
	h.put(node("node-a", true, h.clock.Now()), node("node-b", true, h.clock.Now()))
	if h.c.live.Holding() || len(events) != 2 || events[1].Holding {
		t.Fatalf("guard events %+v; want it released", events)
	}
	released := h.clock.Now()
	h.put(node("node-c", false, t0)) // any update
	if got := h.fencedNodes(); len(got) != 0 {
		t.Fatalf("fenced %v the moment the guard let go", got)
	}
	if s := h.index.Node("node-c"); !s.NotReadySeen.Equal(released) {
		t.Fatalf("node-c NotReadySeen %v; want the release %v", s.NotReadySeen, released)
	}
	h.clock.Step(20*time.Second + 2*time.Millisecond)
	for len(h.fencedNodes()) == 0 {
		h.next(h.c.queue)
	}
	if got := h.fencedNodes(); len(got) != 1 || got[0] != "node-c/NotReady" {
		t.Fatalf("fenced %v; want node-c/NotReady", got)
	}
}

// A node whose kubelet Lease stops changing is fenced once this
// controller has not seen it renewed for the threshold; the others, which
// renew, are not.
func TestHeartbeatLostFences(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.HeartbeatThreshold = 20 * time.Second
	h := newHarness(t, policy)
	nodes := []string{"node-a", "node-b", "node-c"}
	for _, n := range nodes {
		h.put(node(n, true, t0), lease(n, "1"))
	}
	h.claimed(nodes...)
	for i := 2; i <= 3; i++ {
		h.clock.Step(10 * time.Second)
		h.put(lease("node-b", itoa(i)), lease("node-c", itoa(i)))
	}
	if got := h.fencedNodes(); len(got) != 0 {
		t.Fatalf("fenced %v within the threshold", got)
	}
	h.clock.Step(2 * time.Millisecond)
	h.next(h.c.queue)
	for len(h.fencedNodes()) == 0 {
		h.next(h.c.queue)
	}
	if got := h.fencedNodes(); len(got) != 1 || got[0] != "node-a/HeartbeatLost" {
		t.Fatalf("fenced %v; want node-a/HeartbeatLost", got)
	}
}

// A node fenced and tainted by the driver gets the taint lifted only
// once it has stayed Ready for the recovery period; a node that goes
// NotReady again within it counts as a flap.
func TestRecoveryNeedsASteadyPeriod(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.NotReadyThreshold = 20 * time.Second
	var flaps, recovered []string
	h := newHarnessLive(t, Config{Policy: policy,
		NodeRecovered: func(_ context.Context, n string) error { recovered = append(recovered, n); return nil }},
		fencing.LivenessConfig{OnFlap: func(n string) { flaps = append(flaps, n) }})
	tainted := corev1.Taint{Key: fencing.OutOfServiceTaint, Value: fencing.DriverOutOfServiceValue, Effect: corev1.TaintEffectNoExecute}
	h.put(node("node-x", true, t0), node("node-y", true, t0), node("node-a", false, t0, tainted))
	h.put(node("node-a", true, h.clock.Now(), tainted))
	if len(recovered) != 0 {
		t.Fatal("the driver's taint is lifted the moment the node is Ready")
	}
	h.clock.Step(10 * time.Second)
	h.put(node("node-a", false, h.clock.Now(), tainted))
	if len(flaps) != 1 || flaps[0] != "node-a" {
		t.Fatalf("flaps %v; want node-a", flaps)
	}
	h.put(node("node-a", true, h.clock.Now(), tainted))
	h.clock.Step(20*time.Second + 2*time.Millisecond)
	for len(recovered) == 0 {
		h.next(h.c.queue)
	}
	if len(recovered) != 1 || recovered[0] != "node-a" {
		t.Fatalf("recovered %v; want node-a once", recovered)
	}
}
