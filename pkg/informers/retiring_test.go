package informers

import (
	"context"
	"testing"

	"github.com/srvlab/rds-csi/pkg/claims"
	corev1 "k8s.io/api/core/v1"
)

// The informers' cache keeps the record, and the index lists the volume.
func TestIndexListsRetiringVolumes(t *testing.T) {
	p := pv("pv-1", "vol-1", corev1.ReadWriteOnce, "")
	p.Annotations[claims.RetiringAnnotation] = `[{"node":"node-a","n":"n1","at":"2026-11-22T12:00:00Z"}]`
	p.Annotations["other"] = "dropped"
	obj, _ := newRecordMaker(driver).record(p.DeepCopy())
	if got := obj.(*pvRecord); got.retiring != p.Annotations[claims.RetiringAnnotation] || got.claims != "" {
		t.Fatalf("cached record %+v; want the record of retiring attachments alone", got)
	}
	index := NewAttachmentIndex()
	ctrl, feed := NewFedController(index, Config{DriverName: driver})
	quiet := pv("pv-2", "vol-2", corev1.ReadWriteOnce, "")
	for _, o := range []*corev1.PersistentVolume{p, quiet} {
		if err := feed.Apply(o); err != nil {
			t.Fatal(err)
		}
	}
	ctrl.Drain(context.Background())
	got := index.Retiring()
	if len(got) != 1 || got[0].Handle != "vol-1" || len(got[0].PVs) != 1 || len(got[0].PVs[0].Retiring) != 1 || got[0].PVs[0].Retiring[0].Nonce != "n1" {
		t.Fatalf("index.Retiring() = %+v; want vol-1 with node-a's record", got)
	}
}
