package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// The reconcile's check that a claim stands on a VolumeAttachment reads
// the API server where the index shows none: replica b's VolumeAttachment
// watch is held shut, so its index never sees node-a's attachment, and its
// reconcile, finding the export open to a host no claim has, must open it
// to node-a (whose claim and VolumeAttachment the API server holds), not
// close it. It closed it while b's index lagged (a 1-in-40 failure of
// TestReconcileOnLiveClaimsNotALaggingIndex under load).
func TestReconcileChecksTheAttachmentLiveWhenTheIndexLags(t *testing.T) {
	shared := newFakeAPI(testNode("node-a"))
	rdsFake := newFakeRDS(1 << 40)
	a := newPublishEnvWith(t, shared, rdsFake, fencing.DefaultConfig(), allowHostOptions())
	lag := newLaggingClient(t, shared)
	b := newPublishEnvWith(t, lag.Clientset, rdsFake, fencing.DefaultConfig(), allowHostOptions())
	lag.pause("volumeattachments")
	defer lag.resume("volumeattachments")

	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(shared, "pvc-21000000-0000-4000-8000-000000000031", corev1.ReadWriteOnce, false)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	host := a.hostOf(id, "node-a")
	b.waitClaims(id, "node-a")
	if _, ok := b.index.Volume(id).AttachmentOn("node-a"); ok {
		t.Fatal("b's index saw the VolumeAttachment through a held watch")
	}
	d := a.disk(id)
	d.Exported, d.AllowHost = true, nqnB // an export no claim calls for
	a.rds.putDisk(d)
	if n, err := b.fence.Reconcile(context.Background(), nil); err != nil || n != 1 {
		t.Fatalf("reconcile = %d, %v; want the mismatch fixed", n, err)
	}
	wantExport(t, a, id, true, host)
}
