package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The settle every Release ends with lets no one in on a claim that no
// VolumeAttachment stands on, as the leader's reconcile does not (its
// `standing` goal): only a live attachment's own publish opens the export
// to it. A claim without one is a released attachment brought back (a PV
// re-created from a dump taken while it held the volume, or whose release
// reached one PV of the handle before the PV with the record was
// deleted); its host was cut off, and a force-detached kernel still
// holding queued writes reconnects the moment the export allows it again.
//
// The settle is made by every unpublish, even one that released nothing
// (a node whose attach was refused, because the brought-back claim counts
// as a healthy holder's), and now by every fence of a stale node that
// gives up. None of them decides to let a new holder in; a settle that
// has nothing to cut should never open the export to a holder that no
// VolumeAttachment stands on.
//
// Interleaving (ReadWriteOnce, handle with PV p1):
//  1. node-a publishes: n1, export open to H(n1). The admin dumps p1.
//  2. node-a is detached: n1 released, the export closed.
//  3. The admin applies the dump as p2 (same handle): n1's claim is back.
//  4. node-b's attach is refused (node-a's claim); its VolumeAttachment
//     is deleted and the attacher unpublishes it: nothing to release.
func TestSettleOpensNoExportToAClaimWithoutAVolumeAttachment(t *testing.T) {
	a, _, client := newReviewReplicas(t, testNode("node-a"), testNode("node-b"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const name = "pvc-35b00000-0000-4000-8000-000000000001"
	id := a.newVolume(client, name, corev1.ReadWriteOnce, false)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	h1 := a.hostOf(id, nodeA)
	ctx := context.Background()
	dump, err := client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, a, id)
	p2 := testPV(name+"-recreated", id, corev1.ReadWriteOnce, false)
	p2.Annotations = dump.Annotations
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, p2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replica to know the re-created PV and its claim", func() bool {
		v := a.index.Volume(id)
		return indexedPVs(v) == 2 && v.Claims.Has(nodeA)
	})
	// The leader's reconcile leaves it closed (no VolumeAttachment of
	// node-a stands on the claim).
	if _, err := a.fence.Reconcile(ctx, nil); err != nil {
		t.Logf("the leader's pass: %v", err)
	}
	wantClosed(t, a, id)

	if _, err := a.publish(id, "node-b", rwo); err == nil {
		t.Fatal("scripting: node-b's publish should be refused while node-a's claim stands")
	}
	if err := a.unpublish(id, "node-b"); err != nil {
		t.Fatalf("node-b's unpublish: %v", err)
	}
	if d := a.disk(id); d.Exported && d.AllowHost == h1 {
		t.Errorf("node-b's unpublish, which released nothing, opened the export to node-a's released attachment %s, which no VolumeAttachment stands on", h1)
	}
}
