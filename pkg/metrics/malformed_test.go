package metrics

import (
	"testing"
)

// TestMalformedObjects: the gauge follows the counts at each scrape, every
// known pair exported at 0; the counter counts what it is told; label
// values that are not identifiers become "other".
func TestMalformedObjects(t *testing.T) {
	m := New()
	claims, retiring := [2]string{"PersistentVolume", "unreadable-claims"}, [2]string{"PersistentVolume", "unreadable-retiring"}
	counts := map[[2]string]int{claims: 0, retiring: 0}
	seen := m.ReportMalformed(func() map[[2]string]int { return counts })
	want := func(name string, kr [2]string, v float64) {
		t.Helper()
		got, err := value(gather(t, m), name, map[string]string{"kind": kr[0], "reason": kr[1]})
		if err != nil || got != v {
			t.Errorf("%s%v = %v (%v), want %v", name, kr, got, err, v)
		}
	}
	for _, kr := range [][2]string{claims, retiring} {
		want("rds_csi_malformed_objects", kr, 0)
		want("rds_csi_malformed_objects_seen_total", kr, 0)
	}
	counts[claims] = 40
	seen("PersistentVolume", "unreadable-claims")
	seen("PersistentVolume", "unreadable-claims")
	seen("Persistent Volume!", "Unreadable claims")
	want("rds_csi_malformed_objects", claims, 40)
	want("rds_csi_malformed_objects", retiring, 0)
	want("rds_csi_malformed_objects_seen_total", claims, 2)
	want("rds_csi_malformed_objects_seen_total", [2]string{Other, Other}, 1)
	counts[claims] = 0
	want("rds_csi_malformed_objects", claims, 0)

	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	lintFamilies(t, families, "rds_csi_malformed")
}
