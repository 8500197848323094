package informers

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// The controller watches the node plugins' Leases: a labelled Lease in
// their namespace is node-a's second heartbeat, and node-a, its kubelet
// away past the threshold, is not fenced while it renews; node-b, whose
// only Lease in that namespace is not a node plugin's (a leader election
// Lease named like one), is fenced for its kubelet's silence.
func TestControllerWatchesPluginLeases(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.HeartbeatThreshold = 20 * time.Second
	h := newHarnessLive(t, Config{Policy: policy}, fencing.LivenessConfig{PluginLeaseNamespace: pluginNamespace})
	nodes := []string{"node-a", "node-b", "node-c", "node-d"}
	for _, n := range nodes {
		h.put(node(n, true, t0), leaseFor(n, "0", 40*time.Second))
	}
	h.claimed(nodes...)
	impostor := pluginLeaseOf("node-b", "0", 40*time.Second)
	impostor.Labels = nil
	rv := 0
	for step := 1; step <= 4; step++ { // 40 s: node-a's and node-b's kubelets away
		h.clock.Step(10 * time.Second)
		rv++
		h.put(pluginLeaseOf("node-a", fmt.Sprint(rv), 40*time.Second))
		impostor.ResourceVersion = fmt.Sprint(rv)
		h.put(impostor)
		for _, n := range nodes[2:] {
			h.put(leaseFor(n, fmt.Sprint(rv), 40*time.Second))
		}
		h.put(node("node-a", true, t0), node("node-b", true, t0))
	}
	if got := h.fencedNodes(); !slices.Equal(got, []string{"node-b/HeartbeatLost"}) {
		t.Fatalf("fenced %v; want node-b/HeartbeatLost alone (node-a's plugin renews)", got)
	}
	// node-a's plugin Lease deleted: decided on its kubelet's alone.
	h.remove(pluginLeaseOf("node-a", fmt.Sprint(rv), 40*time.Second))
	h.put(node("node-a", true, t0))
	if got := h.fencedNodes(); !slices.Equal(got, []string{"node-b/HeartbeatLost", "node-a/HeartbeatLost"}) {
		t.Fatalf("fenced %v after node-a's plugin Lease was deleted; want node-a fenced for its kubelet's silence", got)
	}
}
