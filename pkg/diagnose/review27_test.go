//go:build review27

package diagnose

import (
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rdshealth"
)

// Review of issue 27 (outside reviewer): holes in kubectl rds check.

// HOLE (kubectl rds check says the RDS is fine while every poll's
// `/disk print stats detail` fails: the drives then carry no S.M.A.R.T.
// values, so a hot drive or one with its critical warning set cannot be
// found, and check neither finds anything nor says that it could not
// look; the poll error counter it reads from the same /metrics is
// ignored): input: the leader polls (staleness 12s, interval 30s),
// rds_csi_rds_health_poll_errors_total{part="stats"} 500, healthy arrays,
// drives without S.M.A.R.T. values, no volume counters.
func TestReview27CheckSaysWhenStatsFail(t *testing.T) {
	w := held("True", time.Hour).snapshots()
	v := rdshealth.View{Polling: true, Interval: 30 * time.Second, Staleness: 12 * time.Second,
		Errors: map[string]uint64{rdshealth.PartStats: 500},
		Snapshot: &rdshealth.Snapshot{
			Arrays:  []rds.Array{{Slot: "raid1", Devices: 2, Members: []string{"nvme1", "nvme2"}}},
			Drives:  []rds.Drive{{Slot: "nvme1", Master: "raid1"}, {Slot: "nvme2", Master: "raid1"}},
			Pool:    &rds.Pool{Slot: "storage-pool", Capacity: rds.Capacity{Total: 1000, Free: 500}},
			Volumes: []rdshealth.Volume{{PV: "pv-1"}},
		}}
	w.c.RDSHealth = serve(t, v)
	r := Check(&w.c)
	if r.OK && len(r.Skipped) == 0 {
		t.Errorf("check reports a clean RDS (no finding, nothing skipped) although 500 polls of the drives' S.M.A.R.T. values failed: %+v", r)
	}
}
