package fencing

import (
	"strings"
	"testing"
	"time"
)

func healthy() NodeState { return NodeState{Exists: true, Ready: true} }

type nodeMap map[string]NodeState

func (m nodeMap) get(name string) NodeState {
	if s, ok := m[name]; ok {
		return s
	}
	return NodeState{} // unknown: deleted
}

func TestDecide(t *testing.T) {
	cfg := DefaultConfig()
	withNotReady := cfg
	withNotReady.NotReadyThreshold = time.Minute
	now := t0.Add(time.Hour)
	allHealthy := nodeMap{"a": healthy(), "b": healthy(), "c": healthy()}

	tests := []struct {
		name      string
		req       Request
		holders   []Holder
		nodes     nodeMap
		cfg       Config
		verdict   Verdict
		blocking  string
		fence     []Fence
		migration bool
		reason    string // substring
	}{
		{name: "free volume", req: Request{VolumeID: "v", Node: "a"}, nodes: allHealthy, verdict: Allow},
		{name: "same node again", req: Request{VolumeID: "v", Node: "a"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: allHealthy, verdict: AlreadyPublished},
		{name: "held by another healthy node", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: allHealthy, verdict: Refuse, blocking: "a", reason: "on node a, which is Ready"},
		{name: "holder node deleted: fenced", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: nodeMap{"b": healthy()}, verdict: Allow,
			fence: []Fence{{Node: "a", Reason: FenceNodeDeleted}}},
		{name: "holder out of service: fenced", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: nodeMap{"a": {Exists: true, OutOfService: true}, "b": healthy()},
			verdict: Allow, fence: []Fence{{Node: "a", Reason: FenceOutOfService}}},
		{name: "holder NotReady, rule off by default: refused", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: nodeMap{"a": {Exists: true, NotReadySince: t0}, "b": healthy()},
			verdict: Refuse, blocking: "a", reason: "NotReady for 1h0m0s, but is not fenced"},
		{name: "holder NotReady past threshold: fenced", cfg: withNotReady, req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: nodeMap{"a": {Exists: true, NotReadySince: now.Add(-2 * time.Minute), NotReadySeen: now.Add(-2 * time.Minute)}, "b": healthy()},
			verdict: Allow, fence: []Fence{{Node: "a", Reason: FenceNotReady}}},
		{name: "holder NotReady under threshold: refused", cfg: withNotReady, req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: nodeMap{"a": {Exists: true, NotReadySince: now.Add(-30 * time.Second), NotReadySeen: now.Add(-30 * time.Second)}, "b": healthy()},
			verdict: Refuse, blocking: "a"},
		// After an API server outage kube-controller-manager stamps every
		// node NotReady at once, with a LastTransitionTime from before
		// (or during) the outage: only how long this controller has seen
		// it counts.
		{name: "holder NotReady long by its condition, seen a moment ago: refused", cfg: withNotReady, req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: nodeMap{"a": {Exists: true, NotReadySince: now.Add(-time.Hour), NotReadySeen: now.Add(-time.Second)}, "b": healthy()},
			verdict: Refuse, blocking: "a"},
		{name: "holder heartbeat lost past threshold: fenced", cfg: Config{HeartbeatThreshold: 15 * time.Second, MigrationTimeout: time.Minute}, req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: nodeMap{"a": {Exists: true, Ready: true, RenewedSeen: now.Add(-16 * time.Second)}, "b": healthy()},
			verdict: Allow, fence: []Fence{{Node: "a", Reason: FenceHeartbeatLost}}},
		{name: "holder heartbeat within threshold: refused", cfg: Config{HeartbeatThreshold: 15 * time.Second, MigrationTimeout: time.Minute}, req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: nodeMap{"a": {Exists: true, Ready: true, RenewedSeen: now.Add(-14 * time.Second)}, "b": healthy()},
			verdict: Refuse, blocking: "a"},
		{name: "heartbeat rule off: refused", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: nodeMap{"a": {Exists: true, Ready: true, RenewedSeen: now.Add(-time.Hour)}, "b": healthy()},
			verdict: Refuse, blocking: "a"},
		// The e2e failover that found two attached nodes: the holder's
		// claim released, its VolumeAttachment still attached and deleting.
		// Only a completed detach hands the volume on.
		{name: "holder detaching a moment ago: still refused (no grace-period handoff)", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0, DetachingSince: now.Add(-time.Second)}}, nodes: allHealthy,
			verdict: Refuse, blocking: "a", reason: "detach has not completed"},
		{name: "holder detaching for long: still refused", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0, DetachingSince: now.Add(-time.Hour)}}, nodes: allHealthy,
			verdict: Refuse, blocking: "a", reason: "detach has not completed"},
		{name: "detaching holder whose node is deleted: fenced", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0, DetachingSince: now.Add(-time.Second)}}, nodes: nodeMap{"b": healthy()},
			verdict: Allow, fence: []Fence{{Node: "a", Reason: FenceNodeDeleted}}},
		{name: "holder's claim made by an earlier incarnation of its node: fenced", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", UID: "uid-old", Since: t0}}, nodes: nodeMap{"a": {Exists: true, Ready: true, UID: "uid-new"}, "b": healthy()},
			verdict: Allow, fence: []Fence{{Node: "a", Reason: FenceNodeRecreated}}},
		{name: "holder's claim of the node's current incarnation: refused", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", UID: "uid-1", Since: t0}}, nodes: nodeMap{"a": {Exists: true, Ready: true, UID: "uid-1"}, "b": healthy()},
			verdict: Refuse, blocking: "a"},
		{name: "holder's claim without a UID (older driver) on a live node: refused", req: Request{VolumeID: "v", Node: "b"},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: nodeMap{"a": {Exists: true, Ready: true, UID: "uid-1"}, "b": healthy()},
			verdict: Refuse, blocking: "a"},
		{name: "same node re-publishing while its detach is pending", req: Request{VolumeID: "v", Node: "a"},
			holders: []Holder{{Node: "a", Since: t0, DetachingSince: now.Add(-time.Hour)}}, nodes: allHealthy, verdict: AlreadyPublished},
		{name: "stale and healthy holders: the healthy one still blocks", req: Request{VolumeID: "v", Node: "c"},
			holders: []Holder{{Node: "a", Since: t0}, {Node: "b", Since: t0.Add(time.Second)}},
			nodes:   nodeMap{"b": healthy(), "c": healthy()}, verdict: Refuse, blocking: "b"},
		{name: "read-only many nodes", req: Request{VolumeID: "v", Node: "c", Mode: MultiNodeReadOnly, ReadOnly: true},
			holders: []Holder{{Node: "a", Since: t0}, {Node: "b", Since: t0}}, nodes: allHealthy, verdict: Allow},
		{name: "read-only volume without the readonly flag (Kubernetes' default): allowed", req: Request{VolumeID: "v", Node: "c", Mode: MultiNodeReadOnly},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: allHealthy, verdict: Allow},
		{name: "multi-writer: first node", req: Request{VolumeID: "v", Node: "a", Mode: MultiNodeMultiWriter},
			nodes: allHealthy, verdict: Allow},
		{name: "multi-writer: a node with an attachment of its own is still a third holder", req: Request{VolumeID: "v", Node: "c", Mode: MultiNodeMultiWriter},
			holders: []Holder{{Node: "a", Since: t0}, {Node: "b", Since: t0.Add(time.Second)}, {Node: "c", Since: t0.Add(2 * time.Second)}},
			nodes:   allHealthy, verdict: Refuse, blocking: "b"},
		{name: "multi-writer: second node starts a migration", req: Request{VolumeID: "v", Node: "b", Mode: MultiNodeMultiWriter},
			holders: []Holder{{Node: "a", Since: t0}}, nodes: allHealthy, verdict: Allow, migration: true},
		{name: "multi-writer: third node refused", req: Request{VolumeID: "v", Node: "c", Mode: MultiNodeMultiWriter},
			holders: []Holder{{Node: "a", Since: t0}, {Node: "b", Since: now.Add(-time.Minute)}}, nodes: allHealthy,
			verdict: Refuse, blocking: "b", reason: "two nodes at most"},
		{name: "multi-writer: third node allowed when a holder is fenced", req: Request{VolumeID: "v", Node: "c", Mode: MultiNodeMultiWriter},
			holders: []Holder{{Node: "a", Since: t0}, {Node: "b", Since: now.Add(-time.Minute)}}, nodes: nodeMap{"b": healthy(), "c": healthy()},
			verdict: Allow, migration: true, fence: []Fence{{Node: "a", Reason: FenceNodeDeleted}}},
		{name: "multi-writer: repeat within the migration window", req: Request{VolumeID: "v", Node: "b", Mode: MultiNodeMultiWriter},
			holders: []Holder{{Node: "a", Since: t0}, {Node: "b", Since: now.Add(-4 * time.Minute)}}, nodes: allHealthy, verdict: AlreadyPublished},
		{name: "multi-writer: migration timed out", req: Request{VolumeID: "v", Node: "b", Mode: MultiNodeMultiWriter},
			holders: []Holder{{Node: "a", Since: t0}, {Node: "b", Since: now.Add(-6 * time.Minute)}}, nodes: allHealthy,
			verdict: Refuse, blocking: "a", reason: "migration timeout"},
		{name: "multi-writer: the source repeating after the timeout is fine", req: Request{VolumeID: "v", Node: "a", Mode: MultiNodeMultiWriter},
			holders: []Holder{{Node: "a", Since: t0}, {Node: "b", Since: now.Add(-6 * time.Minute)}}, nodes: allHealthy, verdict: AlreadyPublished},
		{name: "multi-writer: holders since the same second, either repeating after the timeout is refused", req: Request{VolumeID: "v", Node: "b", Mode: MultiNodeMultiWriter},
			holders: []Holder{{Node: "a", Since: t0}, {Node: "b", Since: t0}}, nodes: allHealthy,
			verdict: Refuse, blocking: "a", reason: "migration timeout"},
		{name: "multi-writer: holders since the same second, the other one too", req: Request{VolumeID: "v", Node: "a", Mode: MultiNodeMultiWriter},
			holders: []Holder{{Node: "a", Since: t0}, {Node: "b", Since: t0}}, nodes: allHealthy,
			verdict: Refuse, blocking: "b", reason: "migration timeout"},
		{name: "multi-writer: holders since the same second, within the window", req: Request{VolumeID: "v", Node: "b", Mode: MultiNodeMultiWriter},
			holders: []Holder{{Node: "a", Since: now.Add(-time.Minute)}, {Node: "b", Since: now.Add(-time.Minute)}}, nodes: allHealthy, verdict: AlreadyPublished},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			if c == (Config{}) {
				c = cfg
			}
			d := Decide(tc.req, tc.holders, tc.nodes.get, now, c)
			if d.Verdict != tc.verdict {
				t.Fatalf("verdict %v (%s), want %v", d.Verdict, d.Reason, tc.verdict)
			}
			if d.Blocking != tc.blocking {
				t.Errorf("blocking %q, want %q", d.Blocking, tc.blocking)
			}
			if !equalFences(d.Fence, tc.fence) {
				t.Errorf("fence %v, want %v", d.Fence, tc.fence)
			}
			if d.MigrationStart != tc.migration {
				t.Errorf("migration start %v, want %v", d.MigrationStart, tc.migration)
			}
			if !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("reason %q does not mention %q", d.Reason, tc.reason)
			}
		})
	}
}

func equalFences(a, b []Fence) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDecideIsPure: the same inputs give the same decision, and the
// caller's slice is not reordered.
func TestDecideIsPure(t *testing.T) {
	holders := []Holder{{Node: "b", Since: t0.Add(time.Minute)}, {Node: "a", Since: t0}}
	nodes := nodeMap{"a": healthy(), "b": healthy(), "c": healthy()}
	first := Decide(Request{VolumeID: "v", Node: "c", Mode: MultiNodeMultiWriter}, holders, nodes.get, t0.Add(time.Hour), DefaultConfig())
	second := Decide(Request{VolumeID: "v", Node: "c", Mode: MultiNodeMultiWriter}, holders, nodes.get, t0.Add(time.Hour), DefaultConfig())
	if first.Verdict != second.Verdict || first.Reason != second.Reason || first.Blocking != second.Blocking {
		t.Fatalf("decisions differ: %+v vs %+v", first, second)
	}
	if holders[0].Node != "b" {
		t.Fatal("Decide reordered the caller's holders")
	}
}

// fuzzHolders turns fuzz input into up to four holders besides the
// requester "x": three bits each say detaching, deleted, out of service.
func fuzzHolders(n uint8, bits uint16, detachAgo int64, now time.Time) ([]Holder, nodeMap) {
	names := []string{"a", "b", "c", "d"}
	nodes := nodeMap{"x": healthy()}
	var holders []Holder
	for i := 0; i < int(n%5) && i < len(names); i++ {
		b := bits >> (3 * i)
		h := Holder{Node: names[i], Since: t0.Add(time.Duration(i) * time.Second)}
		if b&1 != 0 {
			h.DetachingSince = now.Add(-time.Duration(detachAgo%120) * time.Second)
		}
		switch {
		case b&2 != 0:
			// deleted: absent from the map
		case b&4 != 0:
			nodes[names[i]] = NodeState{Exists: true, OutOfService: true}
		default:
			nodes[names[i]] = healthy()
		}
		holders = append(holders, h)
	}
	return holders, nodes
}

// FuzzDecideSingleNodeSafety: whatever the holders and node states, a
// single-node volume is never allowed onto a node while another healthy
// holder exists, detaching or not.
func FuzzDecideSingleNodeSafety(f *testing.F) {
	f.Add(uint8(3), uint16(0b101010), int64(40))
	f.Fuzz(func(t *testing.T, n uint8, bits uint16, detachAgo int64) {
		now := t0.Add(time.Hour)
		holders, nodes := fuzzHolders(n, bits, detachAgo, now)
		cfg := DefaultConfig()
		d := Decide(Request{VolumeID: "v", Node: "x"}, holders, nodes.get, now, cfg)
		if d.Verdict == Refuse {
			return
		}
		for _, h := range holders {
			st := nodes.get(h.Node)
			// Detaching or not: only a completed detach ends a hold.
			blocking := st.Exists && !st.OutOfService
			if blocking {
				t.Fatalf("allowed onto x while %s holds it healthily: %+v", h.Node, d)
			}
		}
	})
}

// FuzzDecideMultiWriterSafety: whatever the holders (the requester among
// them or not), an allowed multi-writer publish never leaves more than two
// healthy holders counting the requester.
func FuzzDecideMultiWriterSafety(f *testing.F) {
	f.Add(uint8(4), uint16(0b000000000), int64(10), true)
	f.Add(uint8(3), uint16(0b010001000), int64(100), false)
	f.Fuzz(func(t *testing.T, n uint8, bits uint16, detachAgo int64, selfHolds bool) {
		now := t0.Add(time.Hour)
		holders, nodes := fuzzHolders(n, bits, detachAgo, now)
		if selfHolds {
			holders = append(holders, Holder{Node: "x", Since: t0.Add(time.Minute)})
		}
		cfg := DefaultConfig()
		d := Decide(Request{VolumeID: "v", Node: "x", Mode: MultiNodeMultiWriter}, holders, nodes.get, now, cfg)
		if d.Verdict == Refuse {
			return
		}
		count := 1 // the requester
		for _, h := range holders {
			st := nodes.get(h.Node)
			if h.Node != "x" && st.Exists && !st.OutOfService {
				count++
			}
		}
		if count > 2 {
			t.Fatalf("multi-writer publish allowed with %d live holders: %+v", count, d)
		}
	})
}
