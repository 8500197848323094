package informers

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// claimOn is node's claim in cs, or none.
func claimOn(cs ClaimSet, node string) Claim {
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
		cs := NewClaimSet(m)
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
	var sets []ClaimSet
	for _, n := range []string{"nonce-1", "nonce-2"} {
		m, err := ParseClaims(raw(n))
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, NewClaimSet(m))
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

// TestCommitWritesAPVOnlyItsOwnClaimsBesideADeletedPV: Commit takes the
// volume's claims for a single PV whose own set is empty (ClaimSet has no
// nil map to tell "none read" from "none there"). That is only safe while
// an index-built entry with one PV never shows claims that PV does not
// have: here the handle's entry merges a live PV without claims (no
// annotation, or "{}") with the VolumeAttachment of a deleted PV that had
// node-a's claim; the commit must not bring node-a's claim back onto the
// live PV.
func TestCommitWritesAPVOnlyItsOwnClaimsBesideADeletedPV(t *testing.T) {
	for _, own := range []string{"", `{}`} {
		x := NewAttachmentIndex()
		x.setPV("pv-0", func(v *Volume) {
			v.Handle, v.ResourceVersion = "vol-1", "5"
			v.Claims = NewClaimSet(map[string]Claim{"node-a": {At: t0, NodeUID: "u-a", Nonce: "n-a"}})
		})
		x.setAttachment("va-0", "pv-0", Attachment{Node: "node-a", VAName: "va-0", Attached: true, Since: t0})
		x.deletePV("pv-0")
		m, err := ParseClaims(own)
		if err != nil {
			t.Fatal(err)
		}
		p1 := pv("pv-1", "vol-1", corev1.ReadWriteOnce, own)
		x.setPV("pv-1", func(v *Volume) {
			v.Handle, v.ResourceVersion, v.Claims = "vol-1", p1.ResourceVersion, NewClaimSet(m)
		})
		v := x.Volume("vol-1")
		if len(v.PVs) != 1 || v.PVs[0].Name != "pv-1" || len(v.Attachments) != 1 {
			t.Fatalf("%q: scripting: the entry should merge pv-1 with the deleted pv-0's attachment: %+v", own, v)
		}
		client := fake.NewClientset(p1)
		if err := NewClaims(client, driver).Commit(context.Background(), v, "node-b", Claim{At: t0.Add(time.Second), NodeUID: "u-b"}, nil); err != nil {
			t.Fatalf("%q: %v", own, err)
		}
		got, err := client.CoreV1().PersistentVolumes().Get(context.Background(), "pv-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claims, err := DecodeClaims(got)
		if err != nil {
			t.Fatal(err)
		}
		if len(claims) != 1 || !has(claims, "node-b") {
			t.Errorf("annotation %q: Commit wrote %v to pv-1, want node-b's claim only (node-a's was on the deleted PV)", own, claims)
		}
	}
}

func has(m map[string]Claim, node string) bool {
	_, ok := m[node]
	return ok
}
