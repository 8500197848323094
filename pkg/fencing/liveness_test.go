package fencing

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

func lease(node, rv string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: NodeLeaseNamespace, ResourceVersion: rv}}
}

func itoa(i int) string { return string(rune('0' + i)) }

// Nothing is timed across a gap in this controller's view of the API (a
// watch that reconnected after one): a heartbeat missed during it is not
// a lost one.
func TestRestoredViewTimesFromTheReconnect(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: Config{HeartbeatThreshold: 20 * time.Second, NotReadyThreshold: 20 * time.Second}, GuardShare: 0})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	l.ObserveNode("n", up)
	l.observeLease("n", "1", 0)
	clock.Step(time.Minute)
	if s := l.Decorate("n", up); !s.RenewedSeen.Equal(t0) {
		t.Fatalf("RenewedSeen %v; want %v", s.RenewedSeen, t0)
	}
	l.Restored()
	if s := l.Decorate("n", up); !s.RenewedSeen.Equal(clock.Now()) {
		t.Fatalf("after the view was restored: RenewedSeen %v; want now", s.RenewedSeen)
	}
	if _, stale := Stale(l.Decorate("n", up), clock.Now(), Config{HeartbeatThreshold: 20 * time.Second}); stale {
		t.Fatal("stale right after the view was restored")
	}
}

// The taint after a heartbeat fence: the node's Ready condition is
// kube-controller-manager's and lags by its grace period, so a node whose
// Lease this controller has not seen renewed past the threshold (confirmed
// by a live read) is tainted although it still reads Ready; a Ready node
// with a live heartbeat is not.
func TestTaintAfterAHeartbeatFence(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: Config{HeartbeatThreshold: 20 * time.Second}, GuardShare: 0})
	client := fake.NewClientset(node("node-a", true, t0), lease("node-a", "7"))
	l.ObserveNode("node-a", NodeStateOf(node("node-a", true, t0)))
	l.observeLease("node-a", "7", 0)
	tt := NewTainter(client, driver, l)
	if err := tt.TaintOutOfService(context.Background(), "node-a"); !errors.Is(err, ErrNotTainted) {
		t.Fatalf("a Ready node with a live heartbeat: %v; want ErrNotTainted", err)
	}
	clock.Step(21 * time.Second)
	if err := tt.TaintOutOfService(context.Background(), "node-a"); err != nil {
		t.Fatalf("a node whose heartbeat was lost: %v", err)
	}
	n, err := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil || !HasDriverTaint(n) {
		t.Fatalf("node-a not tainted: %v %v", n.Spec.Taints, err)
	}
}

// A renewal the watch has not delivered yet (a paused controller) clears
// a lost heartbeat in the live read that backs the fence.
func TestLiveLeaseReadClearsALostHeartbeat(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: Config{HeartbeatThreshold: 20 * time.Second}, GuardShare: 0})
	client := fake.NewClientset(node("node-a", true, t0), lease("node-a", "8"))
	l.ObserveNode("node-a", NodeStateOf(node("node-a", true, t0)))
	l.observeLease("node-a", "7", 0)
	clock.Step(21 * time.Second)
	l.client = client
	s, err := l.LiveNode(context.Background(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if reason, stale := Stale(s, clock.Now(), Config{HeartbeatThreshold: 20 * time.Second}); stale {
		t.Fatalf("stale (%s) although the live Lease shows a renewal the watch had not delivered", reason)
	}
}

// Every heartbeat falling silent at once (a watch that stalls without
// closing, an API server that froze) is a gap in what the controller saw:
// the first renewal after it floors everyone's heartbeat.
func TestSilentHeartbeatsAreAGap(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: 1}) // no guard: the floor alone
	up := NodeState{Exists: true, UID: "u", Ready: true}
	for _, n := range []string{"a", "b"} {
		l.ObserveNode(n, up)
		l.observeLease(n, "1", 0)
	}
	clock.Step(time.Minute)
	l.observeLease("b", "2", 0) // the first renewal after the silence
	if _, stale := Stale(l.Decorate("a", up), clock.Now(), cfg); stale {
		t.Fatal("node a timed out across a silence of every heartbeat")
	}
	clock.Step(21 * time.Second)
	if _, stale := Stale(l.Decorate("a", up), clock.Now(), cfg); !stale {
		t.Fatal("node a, silent for the threshold after the others came back, is not stale")
	}
}

// A node that comes back after a lapse is not flapping; one that lapses
// and comes back again within the recovery period is.
func TestHeartbeatFlaps(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: Config{HeartbeatThreshold: 20 * time.Second}, GuardShare: 1})
	var flaps int
	l.onFlap = (func(string) { flaps++ })
	up := NodeState{Exists: true, UID: "u", Ready: true}
	l.ObserveNode("a", up)
	l.ObserveNode("b", up)
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
