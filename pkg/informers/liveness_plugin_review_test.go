package informers

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/srvlab/rds-csi/pkg/fencing"
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

// A plugin Lease the fence's live read cannot read, for a node whose
// plugin Lease this controller does not know, is taken for "no plugin
// Lease" only once the plugin Lease watch has listed the namespace: then
// the cache says the node has none. Before its first list (a controller
// just started, a new leader whose plugin Lease list is slow or failing)
// the cache knows nothing, and a node whose kubelet restarts while its
// plugin renews was fenced on the kubelet's silence for one failed GET.
func TestUnreadablePluginLeaseBeforeTheListFailsClosed(t *testing.T) {
	cfg := fencing.Config{HeartbeatThreshold: 20 * time.Second}
	for _, listed := range []bool{false, true} {
		clock := clocktesting.NewFakeClock(time.Now())
		l := NewLiveness(clock, cfg, 0)
		l.ReadPluginLeases(pluginNamespace)
		l.pluginLeasesListed(func() bool { return listed })
		client := fake.NewClientset(node("node-a", true, t0), lease("node-a", "7"), pluginLeaseOf("node-a", "9", 40*time.Second))
		client.PrependReactor("get", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetNamespace() == pluginNamespace {
				return true, nil, apierrors.NewInternalError(fmt.Errorf("etcdserver: request timed out"))
			}
			return false, nil, nil
		})
		l.observeNode("node-a", nodeState(node("node-a", true, t0)))
		l.observeLease("node-a", "7", 0)
		clock.Step(21 * time.Second)
		c := NewClaims(client, driver)
		c.TimeWith(l)
		s, err := c.LiveNode(context.Background(), "node-a")
		if !listed {
			if err == nil {
				t.Errorf("plugin Leases not listed yet, node-a's unreadable: confirmed (%+v); want an error (unconfirmed, no fence)", s)
			}
			continue
		}
		if err != nil {
			t.Fatalf("plugin Leases listed (none of node-a's), unreadable: %v; want node-a decided on its kubelet's Lease", err)
		}
		if reason, stale := fencing.Stale(s, clock.Now(), cfg); !stale || reason != fencing.FenceHeartbeatLost {
			t.Fatalf("listed, no plugin Lease known, kubelet silent 21 s: Stale %q %t; want HeartbeatLost", reason, stale)
		}
	}
}

// A plugin Lease's duration is honoured only up to nodelease.MaxDuration:
// a Lease stating more (an operator's edit, a node plugin not of this
// driver's making; the node plugin refuses a longer --node-lease-
// duration) would raise the node's threshold to half of it. Before, one
// stating 2^31-1 s kept a dead node from ever being fenced on its
// heartbeat, and its out-of-service taint from ever being lifted.
func TestPluginLeaseDurationIsBounded(t *testing.T) {
	clock := clocktesting.NewFakeClock(t0)
	cfg := fencing.Config{HeartbeatThreshold: 20 * time.Second}
	l := NewLiveness(clock, cfg, DefaultGuardShare)
	l.ReadPluginLeases(pluginNamespace)
	up := NodeState{Exists: true, UID: "u", Ready: true}
	renew := leaseRenewer(l, 40*time.Second)
	for _, n := range []string{"a", "b", "c"} {
		l.observeNode(n, up)
	}
	renew("a", "b", "c")
	l.observePluginLease("a", "p1", math.MaxInt32*time.Second)
	// a dies now: neither Lease is renewed again.
	var fenced time.Duration
	for i := 1; i <= 60 && fenced == 0; i++ { // 10 minutes
		clock.Step(10 * time.Second)
		renew("b", "c")
		if _, stale := fencing.Stale(l.Decorate("a", up), clock.Now(), cfg); stale {
			fenced = clock.Now().Sub(t0)
		}
	}
	limit := HeartbeatFloor(nodelease.MaxDuration) + 10*time.Second
	if fenced == 0 || fenced > limit {
		t.Fatalf("a dead node whose plugin Lease states %d s fenced after %s (0: not in 10 minutes); want within %s, the threshold of the longest duration honoured", math.MaxInt32, fenced, limit)
	}
}
