package diagnose

import (
	"strings"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/pkg/inventory"
)

// boxes gives the world an inventory of two boxes: rds-a (the default)
// holding pv-1, and rds-b, answering with disks or not (failed).
func (w *world) boxes(failedB string, bDisks ...string) *world {
	inv := &inventory.Inventory{GeneratedAt: w.c.Now,
		Disks: []inventory.Disk{{Slot: "pv-1", RDS: "rds-a", Kind: inventory.KindVolume, SizeBytes: 1 << 30, File: "/p/pv-1.img", Exported: true}},
		Boxes: []inventory.Box{{Name: "rds-a", Default: true, VolumePath: "/p", Disks: 1}, {Name: "rds-b", VolumePath: "/q", Disks: len(bDisks), Error: failedB}}}
	for _, d := range bDisks {
		inv.Disks = append(inv.Disks, inventory.Disk{Slot: "rds-b/" + d, RDS: "rds-b", Kind: inventory.KindVolume, SizeBytes: 1 << 30, File: "/q/" + d + ".img"})
	}
	w.c.Inventory = inv
	return w
}

// onB adds PVC ns/<claim> bound to PV <pv> whose volume is on rds-b.
func (w *world) onB(claim, pv string) *world {
	w.volume(claim, pv, "")
	w.c.PVs[len(w.c.PVs)-1].Spec.CSI.VolumeHandle = "rds-b/" + pv
	return w
}

func TestCheckNamesTheBoxAndSkipsOneThatDidNotAnswer(t *testing.T) {
	// rds-b answers: its orphan disk and its PV's missing disk name it.
	w := held("True", time.Hour).onB("b", "pv-b").boxes("", "pvc-orphan").snapshots()
	r := Check(&w.c)
	var texts []string
	for _, f := range r.Findings {
		texts = append(texts, f.Kind+": "+f.Message)
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{
		"DiskWithoutPV: disk rds-b/pvc-orphan (1073741824 bytes, /q/pvc-orphan.img) on RDS rds-b has no PV",
		"PVWithoutDisk: PV pv-b has no disk rds-b/pv-b on RDS rds-b",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("findings\n%s\nlack %q", all, want)
		}
	}
	// rds-b does not answer: its PV's disk is not missing, it is not
	// checked, and the report says so.
	w = held("True", time.Hour).onB("b", "pv-b").boxes("RDS rds-b: transient RDS transport failure: connection refused").snapshots()
	r = Check(&w.c)
	if len(r.Findings) != 0 {
		t.Errorf("findings with rds-b unlisted: %+v", r.Findings)
	}
	if s := strings.Join(r.Skipped, "\n"); !strings.Contains(s, "disks on RDS rds-b: not listed: RDS rds-b: transient") {
		t.Errorf("skipped %q does not say rds-b was not listed", s)
	}
}

func TestWhyNamesTheVolumesBox(t *testing.T) {
	w := held("True", time.Hour).onB("b", "pv-b").boxes("", "pv-b").snapshots()
	ex := Why(&w.c, KindPV, "", "pv-b")
	s := ex.Stories[0]
	if s.Box != "rds-b" || s.Disk == nil || s.Disk.RDS != "rds-b" {
		t.Errorf("story %+v: want the volume on rds-b, its disk found there", s)
	}
	// Its box does not answer: not checked, never "missing".
	w = held("True", time.Hour).onB("b", "pv-b").boxes("connection refused").snapshots()
	s = Why(&w.c, KindPV, "", "pv-b").Stories[0]
	if s.Verdict.Code == VerdictDiskMissing || !strings.Contains(s.DiskNote, "RDS rds-b did not answer: connection refused") {
		t.Errorf("with rds-b unlisted: verdict %s, disk note %q", s.Verdict.Code, s.DiskNote)
	}
	// The default box's volume is found and named too.
	s = Why(&w.c, KindPV, "", "pv-1").Stories[0]
	if s.Box != "rds-a" || s.Disk == nil {
		t.Errorf("the default box's volume: %+v", s)
	}
}
