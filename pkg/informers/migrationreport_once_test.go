package informers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// An overdue live migration is reported once per migration, whatever the
// number of PVs of its volume handle. A Retained volume's PV re-created
// under a new name gives the handle two PVs; the migration check runs per
// PV (RefenceStale queues one per PV of the handle) and remembers what it
// reported per PV (Controller.overdue), so the new leader reports the
// same migration of the same volume twice (two LiveMigrationTimedOut
// events, two counts of rds_csi_migrations_ended_total{reason="timed_out"}).
func TestOverdueMigrationReportedOncePerVolume(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.MigrationTimeout = 5 * time.Minute
	h := newLeaderHarness(t, Config{Policy: policy})
	now := h.clock.Now()
	h.put(node("node-a", true, t0), node("node-b", true, t0))
	block := corev1.PersistentVolumeBlock
	for _, name := range []string{"pv-1", "pv-1-recreated"} {
		p := unbound(pv(name, "vol-1", corev1.ReadWriteMany, ""))
		p.Spec.VolumeMode = &block
		h.put(p)
	}
	h.put(va("va-a", "pv-1", "node-a", true, now.Add(-time.Hour)), va("va-b", "pv-1", "node-b", true, now.Add(-time.Minute)))
	h.clock.Step(10 * time.Minute)
	h.c.Drain(t.Context())
	if n := h.reported(fencing.ReasonMigrationTimedOut); n != 0 {
		t.Fatalf("a follower reported %d overdue migrations", n)
	}
	h.leader.Store(true)
	h.c.RefenceStale()
	h.c.Drain(t.Context())
	if n := h.reported(fencing.ReasonMigrationTimedOut); n != 1 {
		t.Fatalf("the new leader reported the overdue migration of one volume %d times, want once", n)
	}
}
