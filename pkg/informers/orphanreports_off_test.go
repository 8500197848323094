package informers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// --orphaned-claim-threshold=0 means orphaned claims are never reported
// (the flag's help: "0: never"). A new leader's RefenceStale queues the
// orphan check of every volume whatever the threshold, and the check
// (syncOrphans) has no guard of its own: with a zero threshold every
// claim the index shows without a VolumeAttachment is reported at once,
// on every takeover, including one whose VolumeAttachment the index has
// not seen yet.
func TestNoOrphanReportsWhenTheThresholdIsZero(t *testing.T) {
	h := newLeaderHarness(t, Config{Policy: fencing.DefaultConfig()}) // OrphanedClaimThreshold 0: never
	h.put(node("node-a", true, t0))
	h.put(unbound(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`)))
	h.clock.Step(time.Hour)
	h.leader.Store(true)
	h.c.RefenceStale()
	h.c.Drain(t.Context())
	if n := h.reported(fencing.ReasonOrphanedClaim); n != 0 {
		t.Fatalf("with orphan reports off (threshold 0), the new leader reported %d orphaned claims", n)
	}
}
