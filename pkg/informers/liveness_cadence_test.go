package informers

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

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
