package informers

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

func lease(node, rv string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: NodeLeaseNamespace, ResourceVersion: rv}}
}

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
	var events []GuardEvent
	h := newHarnessWith(t, Config{Policy: policy, GuardChanged: func(e GuardEvent) { events = append(events, e) }})
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

func itoa(i int) string { return string(rune('0' + i)) }

// Nothing is timed across a gap in this controller's view of the API (a
// watch that reconnected after one): a heartbeat missed during it is not
// a lost one.
func TestRestoredViewTimesFromTheReconnect(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	l := NewLiveness(clock, fencing.Config{HeartbeatThreshold: 20 * time.Second, NotReadyThreshold: 20 * time.Second}, 0)
	up := NodeState{Exists: true, UID: "u", Ready: true}
	l.observeNode("n", up)
	l.observeLease("n", "1", 0)
	clock.Step(time.Minute)
	if s := l.Decorate("n", up); !s.RenewedSeen.Equal(t0) {
		t.Fatalf("RenewedSeen %v; want %v", s.RenewedSeen, t0)
	}
	l.Restored()
	if s := l.Decorate("n", up); !s.RenewedSeen.Equal(clock.Now()) {
		t.Fatalf("after the view was restored: RenewedSeen %v; want now", s.RenewedSeen)
	}
	if _, stale := fencing.Stale(l.Decorate("n", up), clock.Now(), fencing.Config{HeartbeatThreshold: 20 * time.Second}); stale {
		t.Fatal("stale right after the view was restored")
	}
}

// A node fenced and tainted by the driver gets the taint lifted only
// once it has stayed Ready for the recovery period; a node that goes
// NotReady again within it counts as a flap.
func TestRecoveryNeedsASteadyPeriod(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.NotReadyThreshold = 20 * time.Second
	var flaps, recovered []string
	h := newHarnessWith(t, Config{Policy: policy, NodeFlapped: func(n string) { flaps = append(flaps, n) },
		NodeRecovered: func(_ context.Context, n string) error { recovered = append(recovered, n); return nil }})
	tainted := corev1.Taint{Key: OutOfServiceTaint, Value: DriverOutOfServiceValue, Effect: corev1.TaintEffectNoExecute}
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

// The taint after a heartbeat fence: the node's Ready condition is
// kube-controller-manager's and lags by its grace period, so a node whose
// Lease this controller has not seen renewed past the threshold (confirmed
// by a live read) is tainted although it still reads Ready; a Ready node
// with a live heartbeat is not.
func TestTaintAfterAHeartbeatFence(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	l := NewLiveness(clock, fencing.Config{HeartbeatThreshold: 20 * time.Second}, 0)
	client := fake.NewClientset(node("node-a", true, t0), lease("node-a", "7"))
	l.observeNode("node-a", nodeState(node("node-a", true, t0)))
	l.observeLease("node-a", "7", 0)
	tt := NewTainter(client, driver)
	tt.TimeWith(l)
	if err := tt.TaintOutOfService(context.Background(), "node-a"); !errors.Is(err, fencing.ErrNotTainted) {
		t.Fatalf("a Ready node with a live heartbeat: %v; want ErrNotTainted", err)
	}
	clock.Step(21 * time.Second)
	if err := tt.TaintOutOfService(context.Background(), "node-a"); err != nil {
		t.Fatalf("a node whose heartbeat was lost: %v", err)
	}
	n, err := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil || !hasDriverTaint(n) {
		t.Fatalf("node-a not tainted: %v %v", n.Spec.Taints, err)
	}
}

// A renewal the watch has not delivered yet (a paused controller) clears
// a lost heartbeat in the live read that backs the fence.
func TestLiveLeaseReadClearsALostHeartbeat(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	l := NewLiveness(clock, fencing.Config{HeartbeatThreshold: 20 * time.Second}, 0)
	client := fake.NewClientset(node("node-a", true, t0), lease("node-a", "8"))
	l.observeNode("node-a", nodeState(node("node-a", true, t0)))
	l.observeLease("node-a", "7", 0)
	clock.Step(21 * time.Second)
	c := NewClaims(client, driver)
	c.TimeWith(l)
	s, err := c.LiveNode(context.Background(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if reason, stale := fencing.Stale(s, clock.Now(), fencing.Config{HeartbeatThreshold: 20 * time.Second}); stale {
		t.Fatalf("stale (%s) although the live Lease shows a renewal the watch had not delivered", reason)
	}
}

// Every heartbeat falling silent at once (a watch that stalls without
// closing, an API server that froze) is a gap in what the controller saw:
// the first renewal after it floors everyone's heartbeat.
func TestSilentHeartbeatsAreAGap(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := fencing.Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(clock, cfg, 1) // no guard: the floor alone
	up := NodeState{Exists: true, UID: "u", Ready: true}
	for _, n := range []string{"a", "b"} {
		l.observeNode(n, up)
		l.observeLease(n, "1", 0)
	}
	clock.Step(time.Minute)
	l.observeLease("b", "2", 0) // the first renewal after the silence
	if _, stale := fencing.Stale(l.Decorate("a", up), clock.Now(), cfg); stale {
		t.Fatal("node a timed out across a silence of every heartbeat")
	}
	clock.Step(21 * time.Second)
	if _, stale := fencing.Stale(l.Decorate("a", up), clock.Now(), cfg); !stale {
		t.Fatal("node a, silent for the threshold after the others came back, is not stale")
	}
}

// A node that comes back after a lapse is not flapping; one that lapses
// and comes back again within the recovery period is.
func TestHeartbeatFlaps(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	l := NewLiveness(clock, fencing.Config{HeartbeatThreshold: 20 * time.Second}, 1)
	var flaps int
	l.OnFlap(func(string) { flaps++ })
	up := NodeState{Exists: true, UID: "u", Ready: true}
	l.observeNode("a", up)
	l.observeNode("b", up)
	rv := 0
	renew := func(n string) { rv++; l.observeLease(n, itoa(rv%10)+n, 0) }
	renew("a")
	renew("b")
	for i := 0; i < 3; i++ { // a lapses, b keeps renewing
		clock.Step(9 * time.Second)
		renew("b")
	}
	renew("a")
	if flaps != 0 {
		t.Fatalf("%d flaps after one recovery", flaps)
	}
	for i := 0; i < 3; i++ {
		clock.Step(9 * time.Second)
		renew("b")
	}
	renew("a")
	if flaps != 1 {
		t.Fatalf("%d flaps after a second lapse within the recovery period; want 1", flaps)
	}
}
