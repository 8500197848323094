package claims

import (
	"reflect"
	"slices"
	"testing"
	"unsafe"
)

// claimOn is node's claim in cs, or none.
func claimOn(cs Set, node string) Claim {
	c, _ := cs.Get(node)
	return c
}

// TestClaimSetHoldsWhatTheAnnotationSays: every field a decision reads
// comes back out of the compact set as it was decoded, by node, in node
// order, and the map form is the decoded map.
func TestClaimSetHoldsWhatTheAnnotationSays(t *testing.T) {
	for _, raw := range []string{
		``,
		`{}`,
		`{"node-a":"2026-11-23T08:00:00Z"}`,
		`{"node-b":{"at":"2026-11-23T08:00:00Z","uid":"u-b","cap":"block/MULTI_NODE_MULTI_WRITER","ro":true,"gen":7,"nqn":"nqn.b","n":"nonce-b","pvs":["pv-1","pv-2"]},` +
			`"node-a":{"at":"2026-11-23T08:00:01Z","uid":"u-a","cap":"mount/SINGLE_NODE_WRITER","gen":2,"n":"nonce-a"},` +
			`"node-c":{"at":"2026-11-23T07:59:59Z"}}`,
	} {
		m, err := ParseClaims(raw)
		if err != nil {
			t.Fatal(err)
		}
		cs := NewSet(m)
		if cs.Len() != len(m) {
			t.Errorf("%s: Len = %d, want %d", raw, cs.Len(), len(m))
		}
		var nodes []string
		for node, c := range cs.All() {
			nodes = append(nodes, node)
			if !reflect.DeepEqual(c, m[node]) {
				t.Errorf("%s: All gives %s %+v, decoded %+v", raw, node, c, m[node])
			}
		}
		if !slices.IsSorted(nodes) {
			t.Errorf("%s: All is not ordered by node: %v", raw, nodes)
		}
		for node, want := range m {
			got, ok := cs.Get(node)
			if !ok || !reflect.DeepEqual(got, want) || !cs.Has(node) {
				t.Errorf("%s: Get(%s) = %+v %t, want %+v", raw, node, got, ok, want)
			}
		}
		for _, absent := range []string{"", "node-0", "node-bb", "node-d"} {
			if _, ok := cs.Get(absent); ok || cs.Has(absent) {
				t.Errorf("%s: Get(%q) found a claim", raw, absent)
			}
		}
		if len(m) == 0 {
			if cs.Map() != nil {
				t.Errorf("%s: Map = %v, want none", raw, cs.Map())
			}
		} else if !reflect.DeepEqual(cs.Map(), m) {
			t.Errorf("%s: Map = %+v, want %+v", raw, cs.Map(), m)
		}
	}
}

// TestClaimSetInternsWhatRepeats: two volumes' claims decoded apart share
// one copy of the node name, node UID, capability and host NQN (what
// repeats across volumes); the nonce, one per attachment, is their own.
func TestClaimSetInternsWhatRepeats(t *testing.T) {
	raw := func(nonce string) string {
		return `{"node-a":{"at":"2026-11-23T08:00:00Z","uid":"u-a","cap":"mount/SINGLE_NODE_WRITER","nqn":"nqn.a","n":"` + nonce + `"}}`
	}
	var sets []Set
	for _, n := range []string{"nonce-1", "nonce-2"} {
		m, err := ParseClaims(raw(n))
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, NewSet(m))
	}
	var nodes [2]string
	var claims [2]Claim
	for i, s := range sets {
		for node, c := range s.All() {
			nodes[i], claims[i] = node, c
		}
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	for what, pair := range map[string][2]string{
		"node":       nodes,
		"node UID":   {claims[0].NodeUID, claims[1].NodeUID},
		"capability": {claims[0].Capability, claims[1].Capability},
		"host NQN":   {claims[0].HostNQN, claims[1].HostNQN},
	} {
		if pair[0] != pair[1] || !same(pair[0], pair[1]) {
			t.Errorf("%s %q and %q: not one shared copy", what, pair[0], pair[1])
		}
	}
	if claims[0].Nonce == claims[1].Nonce {
		t.Errorf("nonces %q and %q: the claims are mixed up", claims[0].Nonce, claims[1].Nonce)
	}
}

func has(m map[string]Claim, node string) bool {
	_, ok := m[node]
	return ok
}
