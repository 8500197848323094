package informers

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// A node plugin's Lease has no owner: when its node is deleted (a scale-
// down, a node replaced under a new name) the Lease stays, and every
// controller start lists it again. Such a Lease is no node: it must not
// count in the mass-outage guard. Before, three leftovers beside three
// live nodes counted as three suspects of six once they aged, and the
// fourth (a dead node) held the guard: the dead node was never fenced,
// and the more nodes a cluster had replaced, the sooner that happened.
func TestOrphanedPluginLeasesDoNotHoldTheGuard(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := fencing.Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(clock, cfg, DefaultGuardShare)
	l.ReadPluginLeases(pluginNamespace)
	up := NodeState{Exists: true, UID: "u", Ready: true}
	renew := leaseRenewer(l, 40*time.Second)
	for _, n := range []string{"a", "b", "c"} {
		l.observeNode(n, up)
	}
	// Leftovers of deleted nodes: one seen deleted while this controller
	// ran, two only listed at its start.
	l.observeNode("x", up)
	l.observePluginLease("x", "p1", 40*time.Second)
	l.observeNode("x", NodeState{})
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
		if reason, stale := fencing.Stale(l.Decorate("a", up), clock.Now(), cfg); stale {
			if reason != fencing.FenceHeartbeatLost {
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
