package fencing

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// A --heartbeat-threshold long enough to mean "practically never"
// (500000h parses; so does anything up to 2562047h) must not overflow the
// guard's arithmetic. Before, suspectShare tenths of it overflowed to a
// negative age, every node with a Lease counted as suspect, the guard held
// for good, and a node NotReady past --not-ready-threshold was never
// fenced: a dead node's volume never moved.
func TestHugeHeartbeatThresholdDoesNotHoldTheGuard(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 500000 * time.Hour, NotReadyThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	renew := leaseRenewer(l, 40*time.Second)
	for _, n := range []string{"a", "b", "c"} {
		l.ObserveNode(n, up)
	}
	renew("a", "b", "c")
	down := NodeState{Exists: true, UID: "u"}
	l.ObserveNode("a", down)
	for i := 0; i < 3; i++ {
		clock.Step(7 * time.Second)
		renew("b", "c")
	}
	if l.Holding() {
		t.Fatal("guard holding with one node of three NotReady and every heartbeat fresh")
	}
	if reason, stale := Stale(l.Decorate("a", down), clock.Now(), cfg); !stale || reason != FenceNotReady {
		t.Fatalf("node a NotReady for 21 s (threshold 20 s): Stale %q %t; want NotReady", reason, stale)
	}
}

// A partition between every node and the API server in a cluster of mixed
// cadences (a rolling change of nodeLeaseDurationSeconds, the documented
// way into the fast threshold): two kubelets renew every 2.5 s (Leases of
// 10 s, threshold 6 s), six every 10 s (Leases of 40 s, threshold 20 s).
// All stop renewing at once. The slow ones look suspect only 12 s after
// their own last renewal, the fast ones lapse 6 s after theirs: counting
// suspects by each node's own threshold alone, the guard held for 2 of 8
// (not more than the share) when a fast node lapsed, and both fast nodes,
// healthy behind the partition, were fenced. A node silent for longer than
// one whose heartbeat has lapsed looks as dead as it and is suspect too.
func TestPartitionOfMixedCadencesFencesNobody(t *testing.T) {
	partition := t0
	clock := clocktesting.NewFakeClock(partition.Add(-10 * time.Second))
	cfg := Config{HeartbeatThreshold: 6 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	// How long before the partition each node last renewed, and its
	// Lease's duration.
	fast := map[string]time.Duration{"f1": 1400 * time.Millisecond, "f2": 300 * time.Millisecond}
	slow := map[string]time.Duration{"s1": 500 * time.Millisecond, "s2": 2100 * time.Millisecond, "s3": 3800 * time.Millisecond,
		"s4": 5400 * time.Millisecond, "s5": 7100 * time.Millisecond, "s6": 8700 * time.Millisecond}
	type renewal struct {
		at    time.Time
		node  string
		lease time.Duration
	}
	var renewals []renewal
	for n, ago := range fast {
		for at := partition.Add(-ago); at.After(clock.Now()); at = at.Add(-2500 * time.Millisecond) {
			renewals = append(renewals, renewal{at, n, 10 * time.Second})
		}
	}
	for n, ago := range slow {
		renewals = append(renewals, renewal{partition.Add(-ago), n, 40 * time.Second})
	}
	slices.SortFunc(renewals, func(a, b renewal) int { return a.at.Compare(b.at) })
	// The controller's start, ten seconds before: every Lease listed.
	for n := range fast {
		l.ObserveNode(n, up)
		l.observeLease(n, "0", 10*time.Second)
	}
	for n := range slow {
		l.ObserveNode(n, up)
		l.observeLease(n, "0", 40*time.Second)
	}
	for i, r := range renewals {
		clock.SetTime(r.at)
		l.observeLease(r.node, fmt.Sprint(i+1), r.lease)
	}
	// 60 s of silence: no node may be stale at any moment.
	clock.SetTime(partition)
	for clock.Now().Before(partition.Add(60 * time.Second)) {
		clock.Step(100 * time.Millisecond)
		for _, n := range []string{"f1", "f2", "s1", "s2", "s3", "s4", "s5", "s6"} {
			if reason, stale := Stale(l.Decorate(n, up), clock.Now(), cfg); stale {
				t.Fatalf("%s after the partition: %s stale (%s), guard holding %t; the partition cut every node off at once", clock.Now().Sub(partition), n, reason, l.Holding())
			}
		}
	}
	if !l.Holding() {
		t.Fatal("guard not holding after 60 s of silence of every heartbeat")
	}
}

// The other side of TestPartitionOfMixedCadencesFencesNobody: in the same
// mixed cluster one fast kubelet dies while the others renew at their
// cadences. It is fenced for its lost heartbeat 6 s after its last
// renewal, not held by the guard (the slow nodes silent as long as it are
// too few to look like a partition).
func TestDeadFastNodeAmongSlowOnesIsFenced(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 6 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	nodes := []string{"f1", "f2", "s1", "s2", "s3", "s4", "s5", "s6"}
	leaseOf := func(n string) time.Duration {
		if n[0] == 'f' {
			return 10 * time.Second
		}
		return 40 * time.Second
	}
	for _, n := range nodes {
		l.ObserveNode(n, up)
		l.observeLease(n, "0", leaseOf(n))
	}
	// Renewals every 100 ms step: fast ones every 2.5 s, the slow ones
	// every 10 s, spread over it; f1 stops at 30 s.
	died := t0.Add(30 * time.Second)
	var fenced, last time.Time
	for step := 1; step <= 900 && fenced.IsZero(); step++ {
		clock.Step(100 * time.Millisecond)
		for i, n := range nodes {
			period := 100
			if leaseOf(n) == 10*time.Second {
				period = 25
			}
			if (step+i*13)%period == 0 && !(n == "f1" && clock.Now().After(died)) {
				l.observeLease(n, fmt.Sprint(step), leaseOf(n))
				if n == "f1" {
					last = clock.Now()
				}
			}
		}
		if reason, stale := Stale(l.Decorate("f1", up), clock.Now(), cfg); stale {
			if reason != FenceHeartbeatLost || clock.Now().Before(died) {
				t.Fatalf("f1 stale (%s) at %s, before it died", reason, clock.Now().Sub(t0))
			}
			fenced = clock.Now()
		}
		for _, n := range nodes[1:] {
			if _, stale := Stale(l.Decorate(n, up), clock.Now(), cfg); stale {
				t.Fatalf("%s, renewing at its cadence, stale at %s", n, clock.Now().Sub(t0))
			}
		}
	}
	// Stale once more than 6 s old: at the first 100 ms step past it.
	if fenced.IsZero() || fenced.Sub(last) > 6100*time.Millisecond {
		t.Fatalf("f1 fenced %v after its last renewal (zero: never); want at its threshold, 6 s", fenced.Sub(last))
	}
}

// The recovery period after a heartbeat lapse counts from the heartbeat's
// return even when this controller's view was restored during the lapse
// (any watch reconnecting after a gap, a guard letting go). Before, the
// return of a node whose floored heartbeat was not past the threshold any
// more did not count as a return: its taint was lifted 2 s after it, not
// the recovery period (6 s) after.
func TestRecoveryCountsFromTheReturnAcrossARestoredView(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 6 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: 1})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	l.ObserveNode("n", up)
	l.ObserveNode("m", up)
	renew := leaseRenewer(l, 10*time.Second)
	renew("n", "m")
	for i := 0; i < 4; i++ { // n's kubelet stalls for 10 s; m renews
		clock.Step(2500 * time.Millisecond)
		renew("m")
	}
	if !l.HeartbeatLost(l.Decorate("n", up)) {
		t.Fatal("n's heartbeat not lost after 10 s (threshold 6 s)")
	}
	l.Restored() // another stream's watch reconnects: n is timed from now
	clock.Step(2 * time.Second)
	renew("n", "m") // n is back
	ok, wait := l.Recovered("n", up)
	if ok || wait != 6*time.Second {
		t.Fatalf("at n's return: recovered %t, wait %s; want not yet, 6s (the recovery period from its return)", ok, wait)
	}
}

// A Lease whose duration shrinks is believed once a renewal at the new
// duration follows: a write that states a shorter duration without the
// kubelet renewing at that cadence (a patched Lease; the kubelet writes its
// own duration back at its next renewal) must not time the node against
// the shorter threshold. Before, the node, renewing every 10 s, was timed
// against 6 s from the write and fenced before its next renewal.
func TestShorterLeaseDurationNeedsARenewalAtIt(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 6 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: 1})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	l.ObserveNode("n", up)
	l.observeLease("n", "1", 40*time.Second)
	clock.Step(3 * time.Second)
	l.observeLease("n", "2", 10*time.Second) // not the kubelet's cadence
	for i := 0; i < 74; i++ {                // up to its next renewal, 10.4 s after the last
		clock.Step(100 * time.Millisecond)
		if reason, stale := Stale(l.Decorate("n", up), clock.Now(), cfg); stale {
			t.Fatalf("%s after its last renewal at the 10 s cadence: stale (%s)", clock.Now().Sub(t0), reason)
		}
	}
	l.observeLease("n", "3", 40*time.Second) // the kubelet's renewal
	// A kubelet that does switch to 10 s (renewing every 2.5 s) gets 6 s
	// from its second renewal at it.
	clock.Step(10 * time.Second)
	l.observeLease("n", "4", 10*time.Second)
	clock.Step(2500 * time.Millisecond)
	l.observeLease("n", "5", 10*time.Second)
	if got := l.HeartbeatThreshold("n"); got != 6*time.Second {
		t.Fatalf("threshold %s after two renewals at 10 s; want 6s", got)
	}
	clock.Step(6*time.Second + time.Millisecond)
	if reason, stale := Stale(l.Decorate("n", up), clock.Now(), cfg); !stale || reason != FenceHeartbeatLost {
		t.Fatalf("6 s after its last renewal at 2.5 s: Stale %q %t; want HeartbeatLost", reason, stale)
	}
}

// A node re-created under the same name (another UID: a machine
// reinstalled, a kubelet re-registering after its Node was deleted) is
// timed from when this controller first saw the new incarnation, as its
// NotReady condition is: its kubelet has not had a chance to renew the
// Lease yet, and the old incarnation's stale heartbeat is not its own.
// Before, it inherited the old one's last renewal, was stale for a lost
// heartbeat the moment it registered, and the fence reaction tainted the
// fresh node out of service.
func TestRecreatedNodeIsTimedFromItsRegistration(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: 1})
	l.ObserveNode("n", NodeState{Exists: true, UID: "u1", Ready: true})
	l.observeLease("n", "1", 40*time.Second)
	clock.Step(time.Minute) // the old incarnation died a minute ago
	fresh := NodeState{Exists: true, UID: "u2"}
	l.ObserveNode("n", fresh)
	if reason, stale := Stale(l.Decorate("n", fresh), clock.Now(), cfg); stale {
		t.Fatalf("the new incarnation stale (%s) the moment it registered", reason)
	}
	clock.Step(20*time.Second + time.Millisecond)
	if reason, stale := Stale(l.Decorate("n", fresh), clock.Now(), cfg); !stale || reason != FenceHeartbeatLost {
		t.Fatalf("the new incarnation, no renewal 20 s after it registered: Stale %q %t; want HeartbeatLost", reason, stale)
	}
}

// The driver's taint is lifted only from a node still recovered when the
// taint is removed: the worker decides the node recovered, the removal
// runs later on the reaction queue (after retries, a leader change), and
// a heartbeat that lapsed again meanwhile keeps the taint. Before,
// RemoveTaint looked at the Ready condition alone (kube-controller-
// manager's, which lags by its grace period) and lifted the taint of a
// node whose heartbeat was lost.
func TestRemoveTaintRechecksTheHeartbeat(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Now())
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: Config{HeartbeatThreshold: 20 * time.Second}, GuardShare: 1})
	taint := corev1.Taint{Key: OutOfServiceTaint, Value: DriverOutOfServiceValue, Effect: corev1.TaintEffectNoExecute}
	client := fake.NewClientset(node("node-a", true, t0, taint), lease("node-a", "7"))
	l.ObserveNode("node-a", NodeStateOf(node("node-a", true, t0)))
	l.observeLease("node-a", "7", 0)
	clock.Step(25 * time.Second) // recovered at 20 s, lost again past 20 s
	tt := NewTainter(client, driver, l)
	if err := tt.RemoveTaint(context.Background(), "node-a"); err != nil {
		t.Fatal(err)
	}
	n, err := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil || !HasDriverTaint(n) {
		t.Fatalf("the driver's taint lifted from a node whose heartbeat is lost (taints %v, %v)", n.Spec.Taints, err)
	}
	// Its kubelet renews (the live Lease read shows it), and stays
	// healthy for the recovery period: lifted.
	if _, err := client.CoordinationV1().Leases(NodeLeaseNamespace).Update(context.Background(), lease("node-a", "8"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.observeLease("node-a", "8", 0)
	clock.Step(10 * time.Second)
	l.observeLease("node-a", "9", 0)
	clock.Step(10*time.Second + time.Millisecond)
	l.observeLease("node-a", "10", 0)
	if err := tt.RemoveTaint(context.Background(), "node-a"); err != nil {
		t.Fatal(err)
	}
	if n, err = client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{}); err != nil || HasDriverTaint(n) {
		t.Fatalf("the driver's taint kept on a node recovered for the recovery period (taints %v, %v)", n.Spec.Taints, err)
	}
}

// A kubelet restart on a node of the fast pool (moving it back to the
// default cadence, an upgrade, a crash) stops the renewals for as long as
// the kubelet takes to start and renew again, often more than 6 s; the
// node, its VMs still writing, was timed against its old 6 s threshold
// and, nothing the kubelet's Lease shows telling this from a dead node
// (no other node is silent, the guard does not hold), fenced. Its node
// plugin's Lease (pkg/nodelease, renewed every 2.5 s on the fast pool)
// goes on renewing through the restart: the node is heard from, and
// nobody is fenced.
func TestKubeletRestartOnAFastNodeFencesNobody(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 6 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	for _, n := range []string{"a", "b", "c"} {
		l.ObserveNode(n, up)
	}
	rv := 0
	for i := 0; i < 12; i++ { // every 2.5 s for 30 s; a's kubelet restarts for 8 s from 20 s
		clock.Step(2500 * time.Millisecond)
		for _, n := range []string{"a", "b", "c"} {
			rv++
			l.observePluginLease(n, fmt.Sprint(rv), 10*time.Second)
			if n == "a" && clock.Now().After(t0.Add(20*time.Second)) && clock.Now().Before(t0.Add(28*time.Second)) {
				continue
			}
			rv++
			d := 10 * time.Second
			if n == "a" && clock.Now().After(t0.Add(20*time.Second)) {
				d = 40 * time.Second
			}
			l.observeLease(n, fmt.Sprint(rv), d)
		}
		if reason, stale := Stale(l.Decorate("a", up), clock.Now(), cfg); stale {
			t.Fatalf("a stale (%s) at %s while its kubelet restarted and its node plugin renewed", reason, clock.Now().Sub(t0))
		}
	}
}

// Every node back from an API server outage (all heartbeats silent past
// the threshold) starts its recovery period then, but that return is no
// lapse of its own: a node's first real lapse after the outage is no
// flap.
func TestReturnFromAnOutageIsNoFlap(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: Config{HeartbeatThreshold: 20 * time.Second}, GuardShare: 1})
	var flaps []string
	l.onFlap = (func(n string) { flaps = append(flaps, n) })
	up := NodeState{Exists: true, UID: "u", Ready: true}
	renew := leaseRenewer(l, 40*time.Second)
	l.ObserveNode("n", up)
	l.ObserveNode("m", up)
	renew("n", "m")
	clock.Step(30 * time.Second) // the API server is down
	renew("n", "m")
	for i := 0; i < 3; i++ { // n's kubelet stalls for 30 s
		clock.Step(10 * time.Second)
		renew("m")
	}
	renew("n")
	if len(flaps) != 0 {
		t.Fatalf("flaps %v: n's first lapse after the outage counted as a flap", flaps)
	}
}

// leaseRenewer renews the given nodes' Leases, each with a new
// resourceVersion and the Lease duration d.
func leaseRenewer(l *Liveness, d time.Duration) func(nodes ...string) {
	rv := 0
	return func(nodes ...string) {
		for _, n := range nodes {
			rv++
			l.observeLease(n, fmt.Sprint(rv), d)
		}
	}
}
