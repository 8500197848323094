package fencing

import (
	"fmt"
	"math"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/srvlab/rds-csi/pkg/nodelease"
)

// A node plugin's Lease has no owner: when its node is deleted (a scale-
// down, a node replaced under a new name) the Lease stays, and every
// controller start lists it again. Such a Lease is no node: it must not
// count in the mass-outage guard. Before, three leftovers beside three
// live nodes counted as three suspects of six once they aged, and the
// fourth (a dead node) held the guard: the dead node was never fenced,
// and the more nodes a cluster had replaced, the sooner that happened.
func TestOrphanedPluginLeasesDoNotHoldTheGuard(t *testing.T) {
	clock, cfg, l, up, renew := threeNodes()
	// Leftovers of deleted nodes: one seen deleted while this controller
	// ran, two only listed at its start.
	l.ObserveNode("x", up)
	l.observePluginLease("x", "p1", 40*time.Second)
	l.ObserveNode("x", NodeState{})
	l.observePluginLease("x", "p1", 40*time.Second) // a relist
	l.observePluginLease("y", "p2", 40*time.Second)
	l.observePluginLease("z", "p3", 40*time.Second)
	renew("a", "b", "c")
	var fenced time.Duration
	for i := 1; i <= 12 && fenced == 0; i++ { // 60 s; a's kubelet is gone
		clock.Step(5 * time.Second)
		if i%2 == 0 {
			renew("b", "c")
		}
		if reason, stale := Stale(l.Decorate("a", up), clock.Now(), cfg); stale {
			if reason != FenceHeartbeatLost {
				t.Fatalf("a stale for %s; want HeartbeatLost", reason)
			}
			fenced = clock.Now().Sub(t0)
		}
	}
	if fenced == 0 {
		t.Fatalf("a, silent for 60 s beside two renewing nodes, never fenced (guard holding: %t): the Leases of deleted nodes held the guard", l.Holding())
	}
	if fenced != 25*time.Second {
		t.Fatalf("a fenced %s after its last renewal; want at the first check past its 20 s threshold (25 s)", fenced)
	}
}

// A plugin Lease's duration is honoured only up to nodelease.MaxDuration:
// a Lease stating more (an operator's edit, a node plugin not of this
// driver's making; the node plugin refuses a longer --node-lease-
// duration) would raise the node's threshold to half of it. Before, one
// stating 2^31-1 s kept a dead node from ever being fenced on its
// heartbeat, and its out-of-service taint from ever being lifted.
func TestPluginLeaseDurationIsBounded(t *testing.T) {
	clock, cfg, l, up, renew := threeNodes()
	renew("a", "b", "c")
	l.observePluginLease("a", "p1", math.MaxInt32*time.Second)
	// a dies now: neither Lease is renewed again.
	var fenced time.Duration
	for i := 1; i <= 60 && fenced == 0; i++ { // 10 minutes
		clock.Step(10 * time.Second)
		renew("b", "c")
		if _, stale := Stale(l.Decorate("a", up), clock.Now(), cfg); stale {
			fenced = clock.Now().Sub(t0)
		}
	}
	limit := HeartbeatFloor(nodelease.MaxDuration) + 10*time.Second
	if fenced == 0 || fenced > limit {
		t.Fatalf("a dead node whose plugin Lease states %d s fenced after %s (0: not in 10 minutes); want within %s, the threshold of the longest duration honoured", math.MaxInt32, fenced, limit)
	}
}

// A node NotReady (its kubelet away past kube-controller-manager's grace)
// whose node plugin renews is not fenced for NotReady while the plugin's
// Lease is within its own threshold: NotReady is timed from the plugin's
// last renewal, and not before that Lease lapses. Before, it was timed
// from the last renewal with the NotReady threshold alone, so a plugin
// renewing less often than that threshold (a 2m Lease renewed every 30 s
// beside the 20 s default; the default 40 s Lease, every 10 s, on a fast
// pool with --not-ready-threshold=8s) had its live node fenced between
// two renewals. Once the plugin stops, the node is fenced when its
// plugin's Lease lapses.
func TestNotReadyWaitsForThePluginsOwnThreshold(t *testing.T) {
	for _, tc := range []struct {
		name                string
		heartbeat, notReady time.Duration
		PluginLease         time.Duration
	}{
		{"2m plugin Lease, default thresholds", 20 * time.Second, 20 * time.Second, 2 * time.Minute},
		{"default plugin Lease, fast thresholds", 6 * time.Second, 8 * time.Second, 40 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clocktesting.NewFakeClock(t0)
			cfg := Config{HeartbeatThreshold: tc.heartbeat, NotReadyThreshold: tc.notReady}
			l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
			l.pluginNamespace = pluginNamespace // as LivenessConfig.PluginLeaseNamespace sets it
			up := NodeState{Exists: true, UID: "u", Ready: true}
			down := NodeState{Exists: true, UID: "u"}
			renew := leaseRenewer(l, 40*time.Second)
			for _, n := range []string{"a", "b", "c"} {
				l.ObserveNode(n, up)
			}
			renew("a", "b", "c")
			interval := tc.PluginLease / 4
			rv := 0
			plugin := func() {
				rv++
				l.observePluginLease("a", fmt.Sprint(rv), tc.PluginLease)
			}
			plugin()
			// a's kubelet is gone from here; NotReady after 40 s; its
			// plugin renews every interval for 5 minutes, then stops.
			var lastPlugin time.Time
			for ms := 100; ms <= 600_000; ms += 100 {
				clock.Step(100 * time.Millisecond)
				if ms%2000 == 0 {
					renew("b", "c")
				}
				if ms == 40_000 {
					l.ObserveNode("a", down)
				}
				if ms <= 300_000 && ms%int(interval/time.Millisecond) == 0 {
					plugin()
					lastPlugin = clock.Now()
				}
				reason, stale := Stale(l.Decorate("a", down), clock.Now(), cfg)
				if !stale {
					continue
				}
				if ms <= 300_000 {
					t.Fatalf("a stale (%s) %s after its kubelet stopped, its plugin renewing every %s", reason, clock.Now().Sub(t0), interval)
				}
				pluginThreshold := max(tc.heartbeat, HeartbeatFloor(tc.PluginLease))
				if d := clock.Now().Sub(lastPlugin); d > pluginThreshold+100*time.Millisecond {
					t.Fatalf("a fenced %s after its plugin's last renewal; want at its plugin Lease's threshold, %s", d, pluginThreshold)
				}
				return
			}
			t.Fatal("a never fenced after its plugin stopped")
		})
	}
}

// threeNodes: a Liveness (heartbeat threshold 20 s, guard at its default
// share, plugin Leases read) that has seen nodes a, b and c up, and what
// renews their kubelets' Leases of 40 s.
func threeNodes() (*clocktesting.FakeClock, Config, *Liveness, NodeState, func(nodes ...string)) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(LivenessConfig{Clock: clock, Policy: cfg, GuardShare: DefaultGuardShare})
	l.pluginNamespace = pluginNamespace // as LivenessConfig.PluginLeaseNamespace sets it
	up := NodeState{Exists: true, UID: "u", Ready: true}
	for _, n := range []string{"a", "b", "c"} {
		l.ObserveNode(n, up)
	}
	return clock, cfg, l, up, leaseRenewer(l, 40*time.Second)
}
