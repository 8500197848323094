package informers

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// countingPVs counts the index worker's reads of each PV from its cache:
// one read is one sync attempt.
type countingPVs struct {
	cache.Store
	gets map[string]int
}

func (c *countingPVs) GetByKey(key string) (any, bool, error) {
	c.gets[key]++
	return c.Store.GetByKey(key)
}

// TestMalformedPVSkippedOncePerVersion: a PV whose claims annotation
// cannot be read is synced once per resourceVersion (not retried with
// backoff for as long as the driver runs), counted, reported once per
// version, keeps its last readable claims, and leaves the set once a
// fixed version is read.
func TestMalformedPVSkippedOncePerVersion(t *testing.T) {
	var seen []Malformed
	set := NewMalformedSet(func(m Malformed) { seen = append(seen, m) })
	h := newHarnessWith(t, Config{Policy: fencing.DefaultConfig(), Malformed: set})
	pvs := &countingPVs{Store: h.c.pvs, gets: map[string]int{}}
	h.c.pvs = pvs
	k := key{kind: kindPV, name: "pv-1"}

	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`))
	bad := pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a": 2024-01-01`)
	bad.ResourceVersion = "2"
	h.put(bad)
	if n := h.c.queue.NumRequeues(k); n != 0 {
		t.Errorf("the malformed PV is queued for %d retries; a deterministic parse error must not be retried", n)
	}
	if pvs.gets["pv-1"] != 2 {
		t.Errorf("synced %d times for two versions", pvs.gets["pv-1"])
	}
	if v := h.index.Volume("vol-1"); v == nil || v.Claims.Len() != 1 {
		t.Fatalf("a corrupt annotation freed the volume: %+v", v)
	}
	if got := set.Counts()[[2]string{MalformedKindPV, MalformedClaims}]; got != 1 {
		t.Errorf("counted %d PVs with unreadable claims, want 1", got)
	}
	ms := set.ForHandle("vol-1")
	if len(ms) != 1 || ms[0].Name != "pv-1" || ms[0].Reason != MalformedClaims || ms[0].Annotation != claims.ClaimsAnnotation || ms[0].ResourceVersion != "2" {
		t.Fatalf("problems of vol-1: %+v", ms)
	}
	if len(seen) != 1 {
		t.Fatalf("reported %d times, want once: %+v", len(seen), seen)
	}

	// The same version again (a relist, a resync): no second report.
	h.put(bad)
	if len(seen) != 1 {
		t.Errorf("the same resourceVersion was reported again: %+v", seen)
	}
	// Another broken version: reported again.
	worse := bad.DeepCopy()
	worse.ResourceVersion = "3"
	worse.Annotations[claims.RetiringAnnotation] = "[not json"
	h.put(worse)
	if len(seen) != 3 || len(set.List()) != 2 {
		t.Errorf("version 3 (claims and retiring record unreadable): reported %+v, listed %+v", seen, set.List())
	}
	if n := h.c.queue.NumRequeues(k); n != 0 {
		t.Errorf("queued for %d retries", n)
	}

	// Fixed: indexed with the new claims, and no longer counted.
	fixed := pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-b":"2026-11-22T13:00:00Z"}`)
	fixed.ResourceVersion = "4"
	h.put(fixed)
	if v := h.index.Volume("vol-1"); v == nil || v.Claims.Len() != 1 || claimOn(v.Claims, "node-b").At.IsZero() {
		t.Fatalf("the fixed PV is not indexed: %+v", v)
	}
	if c := set.Counts(); c[[2]string{MalformedKindPV, MalformedClaims}] != 0 || c[[2]string{MalformedKindPV, MalformedRetiring}] != 0 || len(set.ForHandle("vol-1")) != 0 {
		t.Errorf("the fixed PV is still counted: %v %+v", c, set.List())
	}
}

// TestMalformedPVNeverIndexedAndDeleted: a PV unreadable from its first
// version is not in the index (never as a volume without claims), and
// leaves the set when it is deleted.
func TestMalformedPVNeverIndexedAndDeleted(t *testing.T) {
	set := NewMalformedSet(nil)
	h := newHarnessWith(t, Config{Policy: fencing.DefaultConfig(), Malformed: set})
	bad := pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a": "yesterday", "": "2024-01-01T00:00:00Z"}`)
	h.put(bad)
	if v := h.index.Volume("vol-1"); v.Indexed() {
		t.Fatalf("a PV with unreadable claims is indexed: %+v", v)
	}
	if len(set.ForHandle("vol-1")) != 1 {
		t.Fatalf("not recorded: %+v", set.List())
	}
	h.remove(bad)
	if len(set.List()) != 0 {
		t.Errorf("a deleted PV is still listed: %+v", set.List())
	}
}

// TestUnreadableRetiringIndexed: an unreadable retiring record does not
// stop the index following the PV's claims; it is counted on its own.
func TestUnreadableRetiringIndexed(t *testing.T) {
	set := NewMalformedSet(nil)
	h := newHarnessWith(t, Config{Policy: fencing.DefaultConfig(), Malformed: set})
	p := pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`)
	p.Annotations[claims.RetiringAnnotation] = "not json"
	h.put(p)
	if v := h.index.Volume("vol-1"); v.Claims.Len() != 1 {
		t.Fatalf("claims not indexed: %+v", v)
	}
	if c := set.Counts(); c[[2]string{MalformedKindPV, MalformedRetiring}] != 1 || c[[2]string{MalformedKindPV, MalformedClaims}] != 0 {
		t.Errorf("counts: %v", c)
	}
}

func TestParseErrorsAreUnreadable(t *testing.T) {
	if _, err := claims.ParseClaims("{"); !errors.Is(err, claims.ErrUnreadable) {
		t.Errorf("ParseClaims: %v", err)
	}
	if _, err := claims.ParseRetiring("{"); !errors.Is(err, claims.ErrUnreadable) {
		t.Errorf("ParseRetiring: %v", err)
	}
}
