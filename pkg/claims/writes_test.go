package claims

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// Newer stands for a state only while a view is behind by this replica's
// own chain of writes, and for the last of them.
func TestNewerFollowsOnlyThisReplicasOwnWrites(t *testing.T) {
	const (
		c1 = `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"u1","gen":1}}`
		c2 = `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"u1","gen":2}}`
		c3 = `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"u1","gen":3}}`
	)
	written := func(rv, held string) *corev1.PersistentVolume {
		p := pv("pv-1", "vol-1", corev1.ReadWriteOnce, held)
		p.ResourceVersion = rv
		return p
	}
	for _, tc := range []struct {
		name    string
		writes  func(c *Store) // what this replica wrote
		seen    string         // the resourceVersion the view is at
		wantRV  string         // "": nothing newer
		wantGen int64
	}{
		{"no write", func(*Store) {}, "10", "", 0},
		{"view behind one write", func(c *Store) { c.written.record("10", written("11", c2)) }, "10", "11", 2},
		{"view behind a chain of two", func(c *Store) {
			c.written.record("10", written("11", c2))
			c.written.record("11", written("12", c3))
		}, "10", "12", 3},
		{"the chain's writes answered out of order", func(c *Store) {
			c.written.record("11", written("12", c3))
			c.written.record("10", written("11", c2))
		}, "11", "12", 3},
		{"view caught up", func(c *Store) { c.written.record("10", written("11", c2)) }, "11", "", 0},
		{"someone else wrote: the view is at a version no write of this replica replaced", func(c *Store) {
			c.written.record("10", written("11", c2))
		}, "13", "", 0},
		{"a write that conflicted forgets", func(c *Store) {
			c.written.record("10", written("11", c2))
			c.written.forget("pv-1")
		}, "10", "", 0},
		{"a chain broken by another writer starts again", func(c *Store) {
			c.written.record("10", written("11", c2))
			c.written.record("20", written("21", c3))
		}, "10", "", 0},
		{"an unreadable answer forgets", func(c *Store) {
			c.written.record("10", written("11", c2))
			c.written.record("11", written("12", `{"node-a":`))
		}, "10", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewStore(fake.NewClientset(), driver, false)
			tc.writes(c)
			got, ok := c.Newer("pv-1", "vol-1", tc.seen)
			if tc.wantRV == "" {
				if ok {
					t.Fatalf("Newer = rv %s; want nothing newer than the view", got.ResourceVersion)
				}
				return
			}
			if !ok || got.ResourceVersion != tc.wantRV || claimOn(got.Claims, "node-a").Gen != tc.wantGen {
				t.Fatalf("Newer = rv %s gen %d (%t), want rv %s gen %d", got.ResourceVersion, claimOn(got.Claims, "node-a").Gen, ok, tc.wantRV, tc.wantGen)
			}
		})
	}
	// A PV name reused by another volume is not the same PV.
	c := NewStore(fake.NewClientset(), driver, false)
	c.written.record("10", written("11", c2))
	if _, ok := c.Newer("pv-1", "vol-2", "10"); ok {
		t.Fatal("Newer answered for another volume's PV of the same name")
	}
}
