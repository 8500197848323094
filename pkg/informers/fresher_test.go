package informers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// Fresher stands for a state only while the index is behind by this
// replica's own chain of writes, and for the last of them.
func TestFresherFollowsOnlyThisReplicasOwnWrites(t *testing.T) {
	const (
		c1 = `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"u1","gen":1}}`
		c2 = `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"u1","gen":2}}`
		c3 = `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"u1","gen":3}}`
	)
	written := func(rv, claims string) *corev1.PersistentVolume {
		p := pv("pv-1", "vol-1", corev1.ReadWriteOnce, claims)
		p.ResourceVersion = rv
		return p
	}
	indexAt := func(rv, claims string) *Volume {
		m, err := ParseClaims(claims)
		if err != nil {
			t.Fatal(err)
		}
		cs := NewClaimSet(m)
		return &Volume{PVName: "pv-1", Handle: "vol-1", ResourceVersion: rv, Claims: cs,
			PVs: []PVRef{{Name: "pv-1", ResourceVersion: rv, Claims: cs}}}
	}
	gen := func(v *Volume) int64 { return claimOn(v.Claims, "node-a").Gen }

	for _, tc := range []struct {
		name    string
		writes  func(c *Claims) // what this replica wrote
		index   *Volume
		wantRV  string
		wantGen int64
	}{
		{"no write", func(*Claims) {}, indexAt("10", c1), "10", 1},
		{"index behind one write", func(c *Claims) { c.written.record("10", written("11", c2)) }, indexAt("10", c1), "11", 2},
		{"index behind a chain of two", func(c *Claims) {
			c.written.record("10", written("11", c2))
			c.written.record("11", written("12", c3))
		}, indexAt("10", c1), "12", 3},
		{"the chain's writes answered out of order", func(c *Claims) {
			c.written.record("11", written("12", c3))
			c.written.record("10", written("11", c2))
		}, indexAt("11", c2), "12", 3},
		{"index caught up", func(c *Claims) { c.written.record("10", written("11", c2)) }, indexAt("11", c2), "11", 2},
		{"someone else wrote: the index is at a version no write of this replica replaced", func(c *Claims) {
			c.written.record("10", written("11", c2))
		}, indexAt("13", c1), "13", 1},
		{"a write that conflicted forgets", func(c *Claims) {
			c.written.record("10", written("11", c2))
			c.written.forget("pv-1")
		}, indexAt("10", c1), "10", 1},
		{"a chain broken by another writer starts again", func(c *Claims) {
			c.written.record("10", written("11", c2))
			c.written.record("20", written("21", c3))
		}, indexAt("10", c1), "10", 1},
		{"an unreadable answer forgets", func(c *Claims) {
			c.written.record("10", written("11", c2))
			c.written.record("11", written("12", `{"node-a":`))
		}, indexAt("10", c1), "10", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewClaims(fake.NewClientset(), driver)
			tc.writes(c)
			got := c.Fresher(tc.index)
			if got.ResourceVersion != tc.wantRV || got.PVs[0].ResourceVersion != tc.wantRV || gen(got) != tc.wantGen || claimOn(got.PVs[0].Claims, "node-a").Gen != tc.wantGen {
				t.Fatalf("Fresher = rv %s gen %d (PV rv %s), want rv %s gen %d", got.ResourceVersion, gen(got), got.PVs[0].ResourceVersion, tc.wantRV, tc.wantGen)
			}
			if tc.index.ResourceVersion == tc.wantRV && got != tc.index {
				t.Fatal("Fresher copied an entry it had nothing newer for")
			}
		})
	}

	// A handle with two PVs is never taken from the writes.
	c := NewClaims(fake.NewClientset(), driver)
	c.written.record("10", written("11", c2))
	two := indexAt("10", c1)
	two.PVs = append(two.PVs, PVRef{Name: "pv-2", ResourceVersion: "5"})
	if got := c.Fresher(two); got != two {
		t.Fatal("Fresher rewrote a handle with two PVs")
	}
}
