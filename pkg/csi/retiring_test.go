package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// A release records the attachment it retires on the PV
// (claims.RetiringAnnotation) in the same write. Whoever makes the export
// change after it (the releasing replica, a retried unpublish, the
// fencer's retry, the leader) removes the record; until then the record
// keeps that attachment out, and every change it stands for is reported.

// An unpublish records the attachment it releases and, once the export
// change after the release is made, removes the record itself: the
// leader has nothing left to do.
func TestUnpublishRemovesItsRetiringRecord(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000102", corev1.ReadWriteOnce, false)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	// What the PV records when the change after the release is made
	// (the second swap; the first is the cut before the release).
	swaps, recorded := 0, ""
	a.rds.mu.Lock()
	a.rds.atCall = func(method string) {
		if method == "SwapExport" {
			if swaps++; swaps == 2 {
				pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), id, metav1.GetOptions{})
				if err == nil {
					recorded = pv.Annotations[claims.RetiringAnnotation]
				}
			}
		}
	}
	a.rds.mu.Unlock()
	if err := a.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	a.rds.mu.Lock()
	a.rds.atCall = nil
	a.rds.mu.Unlock()
	if recs, err := claims.ParseRetiring(recorded); err != nil || len(recs) != 1 || recs[0].Node != "node-a" {
		t.Errorf("retiring attachments while the change after the release was made: %q (%v); want node-a's", recorded, err)
	}
	if recs := retiringOf(t, client, id); len(recs) != 0 {
		t.Errorf("retiring attachments after a completed unpublish: %+v; want none", recs)
	}
	wantClosed(t, a, id)
}

// An unpublish with an empty node_id (CSI: unpublish from every node)
// makes the export change a recorded release calls for before it answers,
// as a retried unpublish that finds its node's record does. It lists the
// nodes from the live claims, and the node whose claim a replica released
// before it stopped has no claim left: its record is looked at all the
// same, or an open of the released attachment in flight on the RDS could
// land after the detach completed, until the leader's next pass.
//
// Interleaving:
//  1. a publishes to node-a (export open to H(a)).
//  2. The VolumeAttachment is deleted; replica a releases node-a's claim
//     (the record is written in the same PATCH) and stops before the
//     export change after the release.
//  3. b serves ControllerUnpublishVolume(volume, node_id "").
func TestUnpublishFromEveryNodeHonoursARecordedRelease(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000001a3", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	a.dropAutoVA(id, nodeA)
	releaseAndStop(t, a, id)
	if recs := retiringOf(t, client, id); len(recs) != 1 {
		t.Fatalf("scripting: the release should be recorded: %+v", recs)
	}
	b.rds.mu.Lock()
	before := b.rds.changes[id]
	b.rds.mu.Unlock()

	if _, err := b.cs.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	b.rds.mu.Lock()
	after := b.rds.changes[id]
	b.rds.mu.Unlock()
	if after == before {
		t.Errorf("the unpublish from every node answered without changing the export after node-a's recorded release (records left: %+v): an open of the released attachment in flight can still land", retiringOf(t, client, id))
	}
}

// An unpublish answered OK is reported (a Detached event, the "detached"
// count, MigrationFinished for a migration's end, and the "unpublished"
// log line, one per answered unpublish, which the e2e checker reads to
// know a node's answers ended), also when the export change after the
// release failed and a record was written: ControllerUnpublishVolume then
// answers OK and leaves the change to the leader.
//
// Interleaving: a publishes to node-a; the unpublish's cut (first swap)
// lands, its change after the release (second swap) times out; the
// unpublish answers OK.
func TestUnpublishWhoseSettleFailedIsStillReported(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000001aa", corev1.ReadWriteOnce, false)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	a.drainEvents()
	failSwapAfter(a.rds, 2)
	err := a.unpublish(id, nodeA)
	a.rds.mu.Lock()
	a.rds.atCall = nil
	a.rds.mu.Unlock()
	if err != nil {
		t.Fatalf("scripting: the unpublish should be answered OK: %v", err)
	}
	if recs := retiringOf(t, client, id); len(recs) != 1 {
		t.Fatalf("scripting: the change after the release should have failed, leaving the record: %+v", recs)
	}
	if events := a.drainEvents(); !hasEvent(events, "Detached", "node-a") {
		t.Errorf("the unpublish was answered OK with no Detached event: %v", events)
	}
}

// The one export mismatch that means a retired attachment was let in
// again is reported when the leader fixes it: counted in
// rds_csi_export_claim_mismatch_total, evented on the PV, shown to
// `kubectl rds check` and the alert rule, as every mismatch the leader
// finds is. The reconcile runs RetireMarked first, which closes an export
// a late open of a retired attachment left open (no live claim calls for
// it) and removes the record; the reconcile loop that follows then finds
// the export matching the claims, so the report is RetireMarked's.
//
// Interleaving:
//  1. a publishes to node-a (export open to H(a)).
//  2. The VolumeAttachment is deleted; a shuts H(a) out (export closed,
//     state T1), releases the claim (record written) and stops.
//  3. An open of H(a) conditioned on T1, in flight since before the
//     release, lands: the export is open to a retired attachment.
//  4. The leader (b) runs its reconcile (Fence.Reconcile) with a report.
func TestReconcileReportsALateOpenOfARetiredAttachment(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000001ad", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	hostA := a.hostOf(id, "node-a")
	a.dropAutoVA(id, nodeA)
	releaseAndStop(t, a, id)
	d := a.disk(id)
	t1 := rds.StateOf(&d)
	if t1.Open {
		t.Fatalf("scripting: the cut should have closed the export: %s", t1)
	}
	if _, err := a.rds.SwapExport(context.Background(), id, t1, rds.ExportState{Open: true, Host: hostA}); err != nil {
		t.Fatalf("scripting: the late open: %v", err)
	}
	waitFor(t, "the leader's index to list the record", func() bool { return len(b.index.Retiring()) == 1 })

	var reported []storagefence.Mismatch
	if _, err := b.fence.Reconcile(context.Background(), func(m storagefence.Mismatch) { reported = append(reported, m) }); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, b, id)
	if len(reported) == 0 {
		t.Errorf("the leader closed an export found open to node-a's retired attachment (%s, no live claim) and reported no mismatch", hostA)
	}
}

// A leader that lost its lease while RetireMarked runs (its leading
// context is done) sends no RDS command and leaves the record for the
// next leader.
func TestRetireMarkedStopsOnLostLeadership(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000001a5", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	taintNode(t, client, "node-a", fencing.OutOfServiceTaint, "nodeshutdown")
	fenceWithFailedSettle(t, a, id, "node-a")
	waitFor(t, "replica b's index to list the record", func() bool { return len(b.index.Retiring()) == 1 })
	b.rds.mu.Lock()
	swaps := b.rds.calls["SwapExport"] + b.rds.calls["Retombstone"]
	b.rds.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	left, err := b.fence.RetireMarked(ctx, nil)
	if err == nil || left != 1 {
		t.Errorf("RetireMarked with its leading context done: %d left, %v; want 1 left and an error", left, err)
	}
	b.rds.mu.Lock()
	now := b.rds.calls["SwapExport"] + b.rds.calls["Retombstone"]
	b.rds.mu.Unlock()
	if now != swaps {
		t.Errorf("%d RDS export command(s) after leadership was lost", now-swaps)
	}
	if recs := retiringOf(t, client, id); len(recs) != 1 {
		t.Errorf("records after the stopped pass: %+v; want the fence's record kept", recs)
	}
}

// A publish that replaces its node's own earlier attachment (another
// incarnation) cuts it off and replaces its claim in the commit, and
// records the replaced attachment as retiring, as it does a fenced node's
// released claim: when the export change after the commit fails (or the
// replica stops there), the leader's RetireMarked, which runs every few
// seconds, undoes a late open of the replaced attachment within seconds,
// not after the reconcile period (--export-reconcile-period, 1 min). The
// replaced attachment may still be connected with queued writes (e.g. a
// VM the cloud deleted the Node of but that still runs). The late open is
// one another replica decided between the cut and the commit (the
// leader's reconcile read the cut's state, then the claims with the old
// attachment still in them).
//
// Interleaving:
//  1. a publishes to node-a (uid-1; n0, export open to H0).
//  2. node-a is deleted and re-created (uid-2).
//  3. a's publish of node-a replaces n0: the cut closes the export
//     (state T1); the leader reads T1, then the claims (n0), and sends
//     "open T1 -> H0" (delayed); a commits n1; its change after the
//     commit fails (the RDS stops answering).
//  4. The delayed open lands: the export is open to H0.
//  5. The leader (b) runs RetireMarked.
func TestReplacedOwnAttachmentIsRecordedAsRetiring(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, nodeWithUID("node-a", "uid-1"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000002b6", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	h0 := a.hostOf(id, "node-a")
	ctx := context.Background()
	recreateNodeA(t, client, a, b)

	failGetDiskAt(a.rds, 3) // 1, 2: the cut's rounds; 3: the change after the commit
	_, err := a.cs.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
	a.rds.mu.Lock()
	a.rds.atCall = nil
	a.rds.mu.Unlock()
	if err == nil {
		t.Fatal("scripting: the replacing publish should fail after its commit")
	}
	if c := claimsOf(t, client, id)["node-a"]; c.NodeUID != "uid-2" {
		t.Fatalf("scripting: the commit should have replaced n0: %+v (%v)", c, err)
	}
	d := a.disk(id)
	t1 := rds.StateOf(&d)
	if t1.Open {
		t.Fatalf("scripting: the cut should have closed the export: %s", t1)
	}
	// The leader's open, decided on T1 and the claims before the commit,
	// lands now.
	if _, err := a.rds.SwapExport(ctx, id, t1, rds.ExportState{Open: true, Host: h0}); err != nil {
		t.Fatalf("scripting: the late open: %v", err)
	}
	b.waitClaims(id, "node-a")
	waitFor(t, "the leader's index to see the new incarnation's claim", func() bool {
		return claimOn(b.index.Volume(id).Claims, "node-a").NodeUID == "uid-2"
	})
	if _, err := b.fence.RetireMarked(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if d := a.disk(id); d.Exported && d.AllowHost == h0 {
		t.Errorf("after the leader's RetireMarked the export is still open to node-a's replaced attachment %s (records: %+v): nothing recorded its release", h0, retiringOf(t, client, id))
	}
}
