package informers

import (
	"fmt"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/srvlab/rds-csi/pkg/fencing"
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
	cfg := fencing.Config{HeartbeatThreshold: 6 * time.Second}
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
			l := NewLiveness(clock, cfg, 1) // no guard: the threshold alone
			up := NodeState{Exists: true, UID: "u", Ready: true}
			l.observeNode("n", up)
			l.observeLease("n", "1", tc.lease)
			if got := l.HeartbeatThreshold("n"); got != tc.threshold {
				t.Errorf("HeartbeatThreshold %s; want %s", got, tc.threshold)
			}
			clock.Step(tc.threshold)
			s := l.Decorate("n", up)
			if _, stale := fencing.Stale(s, clock.Now(), cfg); stale || l.HeartbeatLost(s) {
				t.Fatalf("stale (HeartbeatLost %t) %s after its last renewal; its threshold is %s", l.HeartbeatLost(s), tc.threshold, tc.threshold)
			}
			clock.Step(time.Millisecond)
			s = l.Decorate("n", up)
			if reason, stale := fencing.Stale(s, clock.Now(), cfg); !stale || reason != fencing.FenceHeartbeatLost || !l.HeartbeatLost(s) {
				t.Fatalf("Stale %q %t, HeartbeatLost %t just past its threshold %s; want HeartbeatLost", reason, stale, l.HeartbeatLost(s), tc.threshold)
			}
		})
	}
}

// The controller with --heartbeat-threshold=6s over five nodes: node-a
// keeps a kubelet's default cadence (Lease of 40 s, a renewal every 10 s),
// the others renew every 2.5 s (Lease of 10 s). node-a, renewing on time,
// is never fenced; node-b, whose renewals stop, is fenced for its lost
// heartbeat; node-a is fenced once it has not renewed for 20 s (two of
// its renewals), not at 6 s.
func TestFastThresholdSparesADefaultCadenceNode(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.HeartbeatThreshold = 6 * time.Second
	h := newHarness(t, policy)
	fast := []string{"node-b", "node-c", "node-d", "node-e"}
	nodes := append([]string{"node-a"}, fast...)
	rv := 0
	renew := func(n string) {
		rv++
		d := 10 * time.Second
		if n == "node-a" {
			d = 40 * time.Second
		}
		h.put(leaseFor(n, fmt.Sprint(rv), d))
	}
	for _, n := range nodes {
		h.put(node(n, true, t0))
		renew(n)
	}
	h.claimed(nodes...)
	// 30 s: node-b's kubelet is dead; node-a renews every 10 s, the
	// others every 2.5 s. After every step the worker looks at node-a
	// (a Node update), so a threshold it passed is acted on at once.
	for step := 1; step <= 12; step++ {
		h.clock.Step(2500 * time.Millisecond)
		for _, n := range fast[1:] {
			renew(n)
		}
		if step%4 == 0 {
			renew("node-a")
		}
		h.put(node("node-a", true, t0), node("node-b", true, t0))
	}
	if got := h.fencedNodes(); !slices.Equal(got, []string{"node-b/HeartbeatLost"}) {
		t.Fatalf("fenced %v; want node-b/HeartbeatLost alone (node-a renews every 10 s: its threshold is 20 s, not 6 s)", got)
	}
	// node-a stops too (its last renewal was just now).
	for step := 1; step <= 7; step++ {
		h.clock.Step(2500 * time.Millisecond)
		for _, n := range fast[1:] {
			renew(n)
		}
		h.put(node("node-a", true, t0))
	}
	if got := h.fencedNodes(); len(got) != 1 {
		t.Fatalf("fenced %v 17.5 s after node-a's last renewal; its threshold is 20 s", got)
	}
	h.clock.Step(2500*time.Millisecond + 2*time.Millisecond)
	h.put(node("node-a", true, t0))
	if got := h.fencedNodes(); !slices.Equal(got, []string{"node-b/HeartbeatLost", "node-a/HeartbeatLost"}) {
		t.Fatalf("fenced %v 20 s after node-a's last renewal; want node-a too", got)
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
	cfg := fencing.Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(clock, cfg, DefaultGuardShare)
	up := NodeState{Exists: true, UID: "u", Ready: true}
	for _, n := range []string{"a", "b"} {
		l.observeNode(n, up)
		l.observeLease(n, "1", 40*time.Second)
	}
	for i := 2; i <= 4; i++ {
		clock.Step(10300 * time.Millisecond)
		l.observeLease("b", fmt.Sprint(i), 40*time.Second)
	}
	if reason, stale := fencing.Stale(l.Decorate("a", up), clock.Now(), cfg); !stale || reason != fencing.FenceHeartbeatLost {
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
	cfg := fencing.Config{HeartbeatThreshold: 6 * time.Second, NotReadyThreshold: 20 * time.Second}
	l := NewLiveness(clock, cfg, 1)
	up := NodeState{Exists: true, UID: "u", Ready: true}
	// n and another node, m, which renews all along (no silence of every
	// heartbeat at once).
	l.observeNode("n", up)
	l.observeNode("m", up)
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
