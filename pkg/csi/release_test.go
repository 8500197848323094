package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// A Release cuts every attachment it releases, the one it releases, not
// merely the first one it saw. Its write is conditional on its read of the
// PV; when it conflicts, the PV is read again and May is asked again on
// what is there now. If the node's claim meanwhile became another
// attachment that also goes (the node published again, and that
// attachment's detach began too), that attachment is cut off the export
// before its claim goes, exactly as the first. Were it released uncut
// where the export stays open to another holder (a live migration's
// target), nothing would drop the released source's connection: a
// force-detached node (not Ready) would keep writing beside the target.
// Release remembers the attachment it cut and cuts again when the re-read
// approves a different one.
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
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
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

// A Release of one volume never takes another volume's release records
// for its own. It follows every PV a record of its node names, and a PV
// name is not an identity: the duplicate PV of a re-created Retained
// volume is deleted and a PV of another volume made under its name. The
// release leaves such a PV's claims and its records alone: the handle
// check comes before any record is handed out. Were the other volume's
// records of the node taken as this release's, its settle would "retire"
// them on this volume's export and remove them from the other volume's
// PV; the other volume's export change after its release (which makes a
// late open of the released attachment fail, or undoes it) would never be
// made, by this release nor by the leader's RetireMarked, and a late open
// of that released attachment would stay until the minute's reconcile.
//
// Interleaving (node-a holds X and Y):
//  1. X has PVs p1 and p2; node-a's claim of X names both.
//  2. p2 is deleted; a PV named p2 is made for volume Y; Y is published
//     to node-a, then unpublished with the change after its release
//     failing (the RDS timed out): Y's record of node-a stays on p2 for
//     the leader.
//  3. X is unpublished from node-a: its record names p2, which it follows.
func TestReleaseLeavesAnotherVolumesRecordsAlone(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const nameX = "pvc-35d00000-0000-4000-8000-000000000001"
	idX, pvs := twoPVVolume(t, a, b, client, nameX)
	p2 := nameX + "-recreated"
	if c := claimsOf(t, client, pvs[0])[nodeA]; len(c.PVs) != 2 {
		t.Fatalf("scripting: X's claim should name both PVs: %+v", c)
	}
	ctx := context.Background()
	if err := client.CoreV1().PersistentVolumes().Delete(ctx, p2, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replica to see the duplicate PV deleted", func() bool { return indexedPVs(a.index.Volume(idX)) == 1 })
	resp, err := a.cs.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-35d00000-0000-4000-8000-000000000002", VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	if err != nil {
		t.Fatal(err)
	}
	idY := resp.Volume.VolumeId
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, testPV(p2, idY, corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitIndexed(idY)
	if _, err := a.publish(idY, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	failSwapAfter(a.rds, 2) // 1: the cut before Y's release; 2: the change after it
	err = a.unpublish(idY, nodeA)
	a.rds.mu.Lock()
	a.rds.atCall = nil
	a.rds.mu.Unlock()
	if err != nil {
		t.Fatalf("Y's unpublish (answered once its claim is gone): %v", err)
	}
	if len(retiringOf(t, client, p2)) != 1 {
		t.Fatalf("scripting: Y's record of node-a should stay on %s for the leader: %+v", p2, retiringOf(t, client, p2))
	}
	yAfterCut := a.disk(idY)

	if err := a.unpublish(idX, nodeA); err != nil {
		t.Fatalf("X's unpublish from node-a: %v", err)
	}
	if len(retiringOf(t, client, p2)) == 0 {
		if d := a.disk(idY); d.Exported == yAfterCut.Exported && d.AllowHost == yAfterCut.AllowHost {
			t.Errorf("X's unpublish removed volume %s's release record from PV %s (a name X's claim named), and %s's export change after that release was never made (still %q): the leader will not make it", idY, p2, idY, d.AllowHost)
		}
	}
}

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
	a, _, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
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

// The node fencer changes no export without a live read of the node it
// fences. A volume whose PersistentVolume is gone while its
// VolumeAttachment stands (its finalizers removed by hand; the index
// keeps the attachment under the handle) has no claim to read, so the
// fence's May, the live read, is never asked; yet Release now always
// settles, and a settle with no PV reads no claims and closes the export.
// The node fencer is told about a stale node by the index alone (its
// Node watch may be behind: the node deleted and re-created, a taint
// since removed), so the export of a healthy, writing node is closed on
// the cache's word. The reconcile leaves such a disk alone (no PV in the
// index: not its to judge); before the restructure, a fence with no
// claim to release did not touch the RDS either.
func TestNodeFencerClosesNoExportWithoutALiveRead(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, testNode(nodeA))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const name = "pvc-35900000-0000-4000-8000-000000000001"
	id := a.newVolume(client, name, corev1.ReadWriteOnce, false)
	resp, err := a.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	hA := resp.PublishContext[PublishContextHostNQN]
	ctx := context.Background()
	if err := client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the index to keep the attachment without its PV", func() bool {
		v := a.index.Volume(id)
		_, on := v.AttachmentOn(nodeA)
		return v != nil && !v.Indexed() && on
	})
	v := a.index.Volume(id)

	// The index (behind) reports node-a out of service; the API server
	// has it healthy.
	nf := storagefence.NewNodeFencer(storagefence.NodeFencerConfig{Fence: a.fence, Nodes: a.live, Policy: fencing.DefaultConfig(),
		Reporter: fencing.NewReporter(nil, &fenceReasons{})})
	err = nf.NodeStale(ctx, fencing.StaleHolder{Node: nodeA, Reason: fencing.FenceOutOfService, Volumes: []fencing.VolumeRef{v.Ref()}})
	t.Logf("the fence: %v", err)
	if d := a.disk(id); !d.Exported || d.AllowHost != hA {
		t.Errorf("a fence of node-a, healthy by the API server, closed its export (exported=%t allow-host=%s, want %s) with no live read of the node", d.Exported, d.AllowHost, hA)
	}
}
