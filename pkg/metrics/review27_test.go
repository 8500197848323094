//go:build review27

package metrics

import (
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rdshealth"
)

// Review of issue 27 (outside reviewer): holes in the health collector.

// HOLE (an array whose raid-device-count RouterOS did not print is
// reported with rds_csi_rds_array_missing_members 0, a 0 that looks real:
// the driver cannot know how many members are missing, since a pulled
// drive simply drops out of /disk; the issue forbids a 0 standing for
// "not known"; array_degraded 0 then also rests on nothing but the absence
// of a failed flag): input: Array{Slot: "raid1", Members: [nvme1]}, no
// Devices.
func TestReview27MissingMembersUnknownIsNotZero(t *testing.T) {
	view := rdshealth.View{Polling: true, Interval: 30 * time.Second, Errors: map[string]uint64{},
		Snapshot: &rdshealth.Snapshot{Arrays: []rds.Array{{Slot: "raid1", Members: []string{"nvme1"}}}}}
	m := New()
	m.ReportRDSHealth(func() rdshealth.View { return view })
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "rds_csi_rds_array_missing_members" {
			for _, s := range f.GetMetric() {
				t.Errorf("array_missing_members %v = %v, although raid-device-count was not printed", s.GetLabel(), s.GetGauge().GetValue())
			}
		}
	}
}
