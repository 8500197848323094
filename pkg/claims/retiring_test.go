package claims

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func retiringOn(t *testing.T, client *fake.Clientset, name string) []Retiring {
	t.Helper()
	p, err := client.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRetiring(p.Annotations[RetiringAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// With storage fencing a release records the released attachment in the
// same write; without it, nothing is recorded. A retried unpublish (the
// claim gone) still reports the node's record.
func TestReleaseRecordsTheRetiringAttachment(t *testing.T) {
	const held = `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"u1","n":"nonce-1"},"node-b":{"at":"2026-11-22T12:00:01Z","uid":"u2","n":"nonce-2"}}`
	for _, fenced := range []bool{false, true} {
		client := fake.NewClientset(pv("pv-1", "vol-1", corev1.ReadWriteMany, held))
		c := NewStore(client, driver, fenced)
		released, retiring, _, err := c.ReleaseIf(context.Background(), "pv-1", "vol-1", "node-a", always)
		if err != nil || !released {
			t.Fatalf("fenced=%t: ReleaseIf = %t, %v", fenced, released, err)
		}
		recs := retiringOn(t, client, "pv-1")
		if !fenced {
			if len(recs) != 0 || len(retiring) != 0 {
				t.Errorf("without storage fencing the release recorded %+v, reported %+v", recs, retiring)
			}
			continue
		}
		want := Retiring{Node: "node-a", NodeUID: "u1", Nonce: "nonce-1", At: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
		if len(recs) != 1 || !recs[0].same(want) || len(retiring) != 1 || !retiring[0].same(want) {
			t.Fatalf("recorded %+v, reported %+v; want %+v", recs, retiring, want)
		}
		// The retry finds no claim, and the record.
		released, retiring, _, err = c.ReleaseIf(context.Background(), "pv-1", "vol-1", "node-a", always)
		if err != nil || released || len(retiring) != 1 {
			t.Errorf("retried unpublish = %t, %+v, %v; want nothing released and node-a's record", released, retiring, err)
		}
		// node-b's release adds to it; clearing node-a's leaves node-b's.
		if _, _, _, err := c.ReleaseIf(context.Background(), "pv-1", "vol-1", "node-b", always); err != nil {
			t.Fatal(err)
		}
		if err := c.ClearRetiring(context.Background(), "pv-1", []Retiring{want}); err != nil {
			t.Fatal(err)
		}
		if recs := retiringOn(t, client, "pv-1"); len(recs) != 1 || recs[0].Node != "node-b" {
			t.Errorf("after clearing node-a's record: %+v; want node-b's alone", recs)
		}
	}
}

// A record names one attachment: a newer claim of the node (a new nonce)
// is not it; a claim made before nonces is matched by incarnation and time.
func TestRetiringIsOneAttachment(t *testing.T) {
	at := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	r := RetiringOf("node-a", Claim{At: at, NodeUID: "u1", Nonce: "n1"})
	for _, tc := range []struct {
		node string
		c    Claim
		want bool
	}{
		{"node-a", Claim{At: at, NodeUID: "u1", Nonce: "n1", Gen: 3}, true},
		{"node-a", Claim{At: at.Add(time.Second), NodeUID: "u1", Nonce: "n2"}, false},
		{"node-b", Claim{At: at, NodeUID: "u1", Nonce: "n1"}, false},
		{"node-a", Claim{At: at, NodeUID: "u1"}, false},
	} {
		if got := r.Is(tc.node, tc.c); got != tc.want {
			t.Errorf("%+v.Is(%s, %+v) = %t; want %t", r, tc.node, tc.c, got, tc.want)
		}
	}
	legacy := RetiringOf("node-a", Claim{At: at, NodeUID: "u1"})
	if !legacy.Is("node-a", Claim{At: at, NodeUID: "u1"}) || legacy.Is("node-a", Claim{At: at.Add(time.Second), NodeUID: "u1"}) {
		t.Error("a claim without nonce is matched by its incarnation and time")
	}
}
