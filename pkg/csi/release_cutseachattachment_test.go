package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/claims"
)

// A Release cuts every attachment it releases, the one it releases, not
// merely the first one it saw. Its write is conditional on its read of the
// PV; when it conflicts, the PV is read again and May is asked again on
// what is there now. If the node's claim meanwhile became another
// attachment that also goes (the node published again, and that
// attachment's detach began too), that attachment must be cut off the
// export before its claim goes, exactly as the first: Release cuts only
// once per call (`cut` is a flag, not the attachment it cut), so the
// second attachment is released with no cut. Where the export stays open
// to another holder (a live migration's target) nothing drops the
// released source's connection: a force-detached node (not Ready) keeps
// writing beside the target, and beside any node that joins next.
// (Before the restructure, the cut ran on every read that released.)
//
// Interleaving (raw-block RWX, replicas a and b):
//  1. node-a publishes n1 (export H(n1)); its VolumeAttachment is deleted.
//  2. a's unpublish of node-a reads n1, cuts it, and its write is held.
//  3. Meanwhile (through b) node-a's n1 is released, node-a publishes a
//     new attachment n2, node-b joins as the migration's target (the
//     export moves to H(node-b) without a drop: node-a stays connected
//     with n2), node-a's new VolumeAttachment is deleted (a forced
//     detach) and node-a goes NotReady.
//  4. a's write is let go: it conflicts, the PV is read again, n2 goes.
func TestReleaseCutsTheAttachmentItReleasesAfterAConflict(t *testing.T) {
	a, b, client := newReviewReplicas(t, testNode("node-a"), testNode("node-b"))
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	const name = "pvc-35c00000-0000-4000-8000-000000000001"
	id := a.newVolume(client, name, corev1.ReadWriteMany, true)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwx); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deleteVA := func() {
		t.Helper()
		if err := client.StorageV1().VolumeAttachments().Delete(ctx, claims.VolumeAttachmentName(id, DefaultDriverName, nodeA), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deleteVA()

	held := holdAPI(a.own, "patch", "persistentvolumes", name)
	answered := make(chan error, 1)
	go func() {
		_, err := a.cs.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeA})
		answered <- err
	}()
	<-held.entered
	wantClosed(t, a, id) // n1 was cut

	if _, err := b.cs.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeA}); err != nil {
		t.Fatalf("scripting: b's unpublish of n1: %v", err)
	}
	b.waitClaims(id)
	if _, err := b.publish(id, nodeA, rwx); err != nil {
		t.Fatalf("scripting: node-a's new attachment: %v", err)
	}
	b.waitClaims(id, nodeA)
	n2 := claimsOf(t, client, name)[nodeA]
	h2 := b.hostOf(id, nodeA)
	if _, err := b.publish(id, nodeB, rwx); err != nil {
		t.Fatalf("scripting: node-b joining: %v", err)
	}
	b.waitClaims(id, nodeA, nodeB)
	wantExport(t, b, id, true, b.hostOf(id, nodeB))
	deleteVA()
	setReady(t, client, nodeA, corev1.ConditionFalse, publishNow)
	drops := a.drops(id)

	close(held.release)
	if err := <-answered; err != nil {
		t.Fatalf("a's unpublish: %v", err)
	}
	if c, ok := claimsOf(t, client, name)[nodeA]; ok {
		t.Skipf("a's unpublish left node-a's claim %+v (no release of n2 to check)", c)
	}
	if a.drops(id) == drops {
		t.Errorf("node-a's attachment n2 (%s, nonce %s) was released with no cut: the export still allows node-b (%s) and nothing dropped node-a's connection; node-a is not Ready (a forced detach) and keeps writing", h2, n2.Nonce, a.disk(id).AllowHost)
	}
}
