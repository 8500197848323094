package fencing

import (
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// leaseFor is a node's kubelet Lease stating its duration (the kubelet's
// nodeLeaseDurationSeconds; it renews every quarter of it).
func leaseFor(node, rv string, duration time.Duration) *coordinationv1.Lease {
	l := lease(node, rv)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(duration / time.Second))
	return l
}

// The heartbeat threshold is never shorter than two of a node's own
// kubelet renewals: with --heartbeat-threshold=6s (for kubelets renewing
// every 2.5 s, nodeLeaseDurationSeconds=10) a node still on the default
// cadence (40 s, renewals every 10 s) or whose Lease states no duration is
// timed against 20 s; a fast one against 6 s. Before, every node was timed
// against 6 s and the default one was fenced between two renewals.
func TestHeartbeatThresholdFollowsTheKubeletsCadence(t *testing.T) {
	cfg := Config{HeartbeatThreshold: 6 * time.Second}
	for _, tc := range []struct {
		lease     time.Duration // the Lease's duration (0: none stated)
		threshold time.Duration // the node's own
	}{
		{10 * time.Second, 6 * time.Second},
		{12 * time.Second, 6 * time.Second},
		{16 * time.Second, 8 * time.Second},
		{40 * time.Second, 20 * time.Second},
		{0, 20 * time.Second},
	} {
		t.Run(fmt.Sprintf("lease %s", tc.lease), func(t *testing.T) {
			clock := clocktesting.NewFakeClock(t0)
			l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: 1}) // no guard: the threshold alone
			up := NodeState{Exists: true, UID: "u", Ready: true}
			l.ObserveNode("n", up)
			l.observeLease("n", "1", tc.lease)
			if got := l.HeartbeatThreshold("n"); got != tc.threshold {
				t.Errorf("HeartbeatThreshold %s; want %s", got, tc.threshold)
			}
			clock.Step(tc.threshold)
			s := l.Decorate("n", up)
			if _, stale := Stale(s, clock.Now(), cfg); stale || l.HeartbeatLost(s) {
				t.Fatalf("stale (HeartbeatLost %t) %s after its last renewal; its threshold is %s", l.HeartbeatLost(s), tc.threshold, tc.threshold)
			}
			clock.Step(time.Millisecond)
			s = l.Decorate("n", up)
			if reason, stale := Stale(s, clock.Now(), cfg); !stale || reason != FenceHeartbeatLost || !l.HeartbeatLost(s) {
				t.Fatalf("Stale %q %t, HeartbeatLost %t just past its threshold %s; want HeartbeatLost", reason, stale, l.HeartbeatLost(s), tc.threshold)
			}
		})
	}
}

// With one node left renewing, a real kubelet's renewals come a little
// more than its 10 s apart (jitter, and each period starts when the last
// renewal ended). That is no silence of every heartbeat: node-a, dead,
// is fenced 20 s after its last renewal. Before, every renewal of node-b
// (10.3 s after the last one, more than half the threshold) counted as a
// gap in what the controller saw and floored node-a's heartbeat at it, so
// node-a was never fenced.
func TestOneNodeLeftRenewingIsNoGap(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	for _, n := range []string{"a", "b"} {
		l.ObserveNode(n, up)
		l.observeLease(n, "1", 40*time.Second)
	}
	for i := 2; i <= 4; i++ {
		clock.Step(10300 * time.Millisecond)
		l.observeLease("b", fmt.Sprint(i), 40*time.Second)
	}
	if reason, stale := Stale(l.Decorate("a", up), clock.Now(), cfg); !stale || reason != FenceHeartbeatLost {
		t.Fatalf("node a, silent for %s while b renews every 10.3 s: Stale %q %t; want HeartbeatLost", 3*10300*time.Millisecond, reason, stale)
	}
}

// Hysteresis after a heartbeat fence: a node whose Lease lapsed past the
// threshold while its Ready condition stayed True (kube-controller-
// manager's grace is longer than the lapse) counts as healthy only from
// its heartbeat's return, so the driver's taint stays for the recovery
// period after it. Before, Recovered timed it from its turning Ready long
// ago, the taint was lifted at its first renewal, and a flapping node was
// tainted and untainted with every lapse.
func TestRecoveryAfterAHeartbeatLapseNeedsASteadyPeriod(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 6 * time.Second, NotReadyThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: 1})
	up := NodeState{Exists: true, UID: "u", Ready: true}
	// n and another node, m, which renews all along (no silence of every
	// heartbeat at once).
	l.ObserveNode("n", up)
	l.ObserveNode("m", up)
	rv := 0
	renewFor := func(d time.Duration, nodes ...string) { // a renewal every 2.5 s for d
		for end := clock.Now().Add(d); ; clock.Step(2500 * time.Millisecond) {
			for _, n := range nodes {
				rv++
				l.observeLease(n, fmt.Sprint(rv), 10*time.Second)
			}
			if !clock.Now().Before(end) {
				return
			}
		}
	}
	renewFor(time.Minute, "n", "m")
	if ok, _ := l.Recovered("n", up); !ok {
		t.Fatal("a node healthy for a minute is not recovered")
	}
	clock.Step(2500 * time.Millisecond)
	renewFor(7500*time.Millisecond, "m") // n lapses: fenced and tainted
	if ok, _ := l.Recovered("n", up); ok {
		t.Fatal("recovered while its heartbeat is lost")
	}
	renewFor(0, "n", "m") // back, Ready all along
	ok, wait := l.Recovered("n", up)
	if ok || wait != 20*time.Second {
		t.Fatalf("at its heartbeat's return: recovered %t, wait %s; want not yet, 20s (the recovery period)", ok, wait)
	}
	clock.Step(2500 * time.Millisecond)
	renewFor(20*time.Second, "n", "m")
	if ok, _ := l.Recovered("n", up); !ok {
		t.Fatal("not recovered after the recovery period of renewals")
	}
}
