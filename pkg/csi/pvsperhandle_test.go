package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// One volume handle may have several PersistentVolumes: a Retained PV
// re-created under a new name, a PV re-created from a dump, a name reused
// for another volume. A claim is committed to every PV of the handle and
// names them; a release reaches them one by one and may stop part-way;
// and a PV may come or go in between. None of that lets a released
// attachment back in, releases another volume's claim, or cuts a live
// attachment.

// A fenced attachment stays out between the fences of a handle's two PVs.
// The fencer releases PV by PV (ReleaseIfStale per PV) and Settle
// excludes the released attachment on every PV; the record of the release
// stays while another PV of the handle still shows the released
// attachment. So the leader's reconcile (its index merges the claims of
// both PVs), re-deriving the export from the live claims of every PV,
// does not open it to the fenced attachment, whose kernel would reconnect
// within ctrl_loss_tmo and land its queued writes; its pass completes the
// release on the second PV and removes the records.
// TestFenceDoesNotReopenBetweenPVs pins the same through Settle.
//
// Interleaving (ReadWriteOnce volume, handle with PVs p1 and p2):
//  1. a publishes to node-a: claims on p1 and p2, export open to H(a).
//  2. node-a is tainted out of service; the fence of p1 runs on a:
//     CutOff closes, release on p1 (+record), Settle (fresh tombstone).
//     p2's fence has not run yet (queued, or its cut is failing on a
//     slow RDS).
//  3. The leader (b) runs its reconcile (Fence.Reconcile).
func TestReconcileBetweenTheFencesOfTwoPVsKeepsTheFencedAttachmentOut(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	id, pvs := twoPVVolume(t, a, b, client, "pvc-2f000000-0000-4000-8000-0000000001a1")
	hostA := hostOn(t, a, client, id, pvs[1], "node-a")
	wantExport(t, a, id, true, hostA)

	taintNode(t, client, "node-a", fencing.OutOfServiceTaint, "nodeshutdown")
	// The fence reaches one PV: its write to the other fails.
	first := a.index.Volume(id).PVName
	second := pvs[0]
	if second == first {
		second = pvs[1]
	}
	failAPIOnce(a.own, "patch", "persistentvolumes", second, apierrors.NewServiceUnavailable("injected"))
	released, err := a.fenceNode(context.Background(), id, "node-a")
	if err == nil || !released {
		t.Fatalf("scripting: the fence should release node-a's claim on %s and fail on %s: released=%t, %v", first, second, released, err)
	}
	pvs = []string{first, second}
	wantClosed(t, a, id)
	// Since the fix the record stays while another PV claims the
	// attachment.
	if recs := retiringOf(t, client, pvs[0]); len(recs) != 1 {
		t.Fatalf("the fence of %s removed its record while %s still claims the attachment: %+v", pvs[0], pvs[1], recs)
	}
	// The leader's index sees the release on the first PV (and the claims
	// before it: "no claim on the first PV" holds too for an index that
	// has not seen the publish yet).
	b.waitCaughtUp(id)

	if _, err := b.fence.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if d := a.disk(id); d.Exported && d.AllowHost == hostA {
		t.Errorf("the leader's reconcile reopened the export to node-a's fenced attachment (%s) between the fences of the handle's two PVs", hostA)
	}
	// The leader's pass completed the release on the second PV and
	// removed the records.
	if has(claimsOf(t, client, pvs[1]), "node-a") {
		t.Errorf("the fenced attachment is still claimed on %s after the leader's pass", pvs[1])
	}
	for _, pv := range pvs {
		if recs := retiringOf(t, client, pv); len(recs) != 0 {
			t.Errorf("records left on %s after the leader's pass: %+v", pv, recs)
		}
	}
}

// The leader's pass over an unpublish that released the claim on the
// first PV of the handle (record written there) and failed on the second
// (an API error, or the replica died between the two PATCHes) keeps the
// export closed to the released attachment. In one pass RetireMarked
// treats the attachment as gone on every PV (closes the export) and
// removes the record; the reconcile loop that follows, re-deriving the
// export from the merged claims where the second PV still shows the
// attachment, must not undo that retirement by opening the export to it:
// a force-detached attachment would be let in again in the middle of its
// detach, its kernel reconnecting with queued writes after the export was
// cut for it.
//
// Interleaving (ReadWriteOnce volume, handle with PVs p1 and p2; node-a
// out of service, so the detach is a forced one and the unpublish cuts):
//  1. a publishes to node-a: claims on p1 and p2, export open to H(a).
//  2. node-a's VolumeAttachment is deleted; a's unpublish shuts H(a) out
//     (export closed), releases p1 (+record), and its PATCH of p2 fails:
//     the unpublish fails, to be retried by the attacher with backoff.
//  3. The leader (b) runs its reconcile (Fence.Reconcile) before the retry.
func TestLeaderCompletesAPartialUnpublishWithoutReopening(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	id, pvs := twoPVVolume(t, a, b, client, "pvc-2f000000-0000-4000-8000-0000000001a2")
	hostA := hostOn(t, a, client, id, pvs[1], "node-a")
	taintNode(t, client, "node-a", fencing.OutOfServiceTaint, "nodeshutdown")

	failed := false
	client.PrependReactor("patch", "persistentvolumes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.(k8stesting.PatchAction).GetName() != pvs[1] || failed {
			return false, nil, nil
		}
		failed = true
		return true, nil, apierrors.NewInternalError(context.DeadlineExceeded)
	})
	if err := a.unpublish(id, nodeA); err == nil {
		t.Fatal("scripting: the unpublish should fail on the second PV")
	}
	if !failed || has(claimsOf(t, client, pvs[0]), "node-a") || !has(claimsOf(t, client, pvs[1]), "node-a") {
		t.Fatalf("scripting: want node-a released on %s only: %v / %v", pvs[0], keys(claimsOf(t, client, pvs[0])), keys(claimsOf(t, client, pvs[1])))
	}
	if recs := retiringOf(t, client, pvs[0]); len(recs) != 1 {
		t.Fatalf("scripting: the release on %s should be recorded: %+v", pvs[0], recs)
	}
	wantClosed(t, a, id)
	waitFor(t, "the leader's index to list the record", func() bool { return len(b.index.Retiring()) == 1 })

	if _, err := b.fence.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if d := a.disk(id); d.Exported && d.AllowHost == hostA {
		t.Errorf("the leader's pass (RetireMarked, then the reconcile) reopened the export to node-a's released, force-detached attachment (%s); retiring records left: %+v", hostA, retiringOf(t, client, pvs[0]))
	}
}

// An unpublish releases the claim on every PV of the handle, also on one
// its replica's index has not seen yet (a Retained volume's PV re-created
// a moment ago) to which another replica that knew both PVs committed the
// claim. Were it to release only the PVs its index lists (v.PVs), find
// the export in line with "no claim" (the live claims of the PVs it
// knows), remove its record and answer success, the second PV would keep
// the claim: nothing retries the detach (the VolumeAttachment is gone),
// every other node's publish is refused behind it, and the leader's
// reconcile (which knows both PVs) reopens the export to the detached
// attachment.
//
// Interleaving (replica b's PV watch lags):
//  1. The volume has PV p1; b's PV events stop arriving; p2 is created
//     for the same handle; replica a sees both.
//  2. a publishes to node-a: claims on p1 and p2, export open to H(a).
//  3. node-a's VolumeAttachment is deleted; the unpublish is served by
//     b: released on p1, export closed, answered OK.
//  4. The leader (a) runs its reconcile (Fence.Reconcile).
func TestUnpublishReleasesAPVItsIndexHasNotSeen(t *testing.T) {
	shared := newFakeAPI(testNode("node-a"))
	rdsFake := newFakeRDS(1 << 40)
	a := newPublishEnvWith(t, shared, rdsFake, fencing.DefaultConfig(), allowHostOptions(), withoutNodeFencer)
	lag := newLaggingClient(t, shared)
	b := newPublishEnvWith(t, lag.Clientset, rdsFake, fencing.DefaultConfig(), allowHostOptions(), withoutNodeFencer)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const p1 = "pvc-2f000000-0000-4000-8000-0000000001a7"
	id := a.newVolume(shared, p1, corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	lag.pause("persistentvolumes")
	p2 := p1 + "-recreated"
	if _, err := shared.CoreV1().PersistentVolumes().Create(context.Background(), testPV(p2, id, corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "replica a to know both PVs", func() bool { return indexedPVs(a.index.Volume(id)) == 2 })
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	hostA := hostOn(t, a, shared, id, p2, "node-a")

	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatalf("scripting: the unpublish on b: %v", err)
	}
	if c := claimsOf(t, shared, p2); has(c, "node-a") {
		t.Errorf("the unpublish answered OK and left node-a's claim on %s: an orphaned claim", p2)
	}
	// Replica a's index sees the release on p1.
	a.waitCaughtUp(id)
	if _, err := a.fence.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if d := a.disk(id); d.Exported && d.AllowHost == hostA {
		t.Errorf("after the answered detach, the leader's reconcile reopened the export to node-a's detached attachment (%s)", hostA)
	}
	lag.resume("persistentvolumes")
}

// A release outlives the PV that holds its record. When the release
// reached one PV of the handle and not the other (the attacher retries
// the detach with backoff), and the PV where the release happened, and
// its record with it, is deleted meanwhile (the old duplicate of a
// re-created Retained PV, cleaned up), the leader's reconcile, re-deriving
// the export from the remaining PV, does not open it to the released
// attachment: a force-detached, cut-off attachment whose kernel would
// reconnect within ctrl_loss_tmo and land its queued writes.
//
// Interleaving (node-a out of service: a forced detach, which cuts):
//  1. a publishes X (PVs p1 p2) to node-a: export open to H(a).
//  2. The unpublish cuts H(a) off, releases p1 (+record on p1), and its
//     PATCH of p2 fails: the detach is retried later.
//  3. p1 is deleted.
//  4. The leader (b) runs its reconcile (Fence.Reconcile) before the retry.
func TestReleaseOutlivesThePVHoldingItsRecord(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	id, pvs := twoPVVolume(t, a, b, client, "pvc-2f000000-0000-4000-8000-0000000002b3")
	hostA := hostOn(t, a, client, id, pvs[1], "node-a")
	taintNode(t, client, "node-a", fencing.OutOfServiceTaint, "nodeshutdown")
	unpublishFailingOn(t, a, client, id, pvs[1])
	if len(retiringOf(t, client, pvs[0])) != 1 || !has(claimsOf(t, client, pvs[1]), "node-a") {
		t.Fatalf("scripting: want the release recorded on %s and the claim left on %s", pvs[0], pvs[1])
	}
	wantClosed(t, a, id)
	if err := client.CoreV1().PersistentVolumes().Delete(context.Background(), pvs[0], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the leader's index to see the PV deleted", func() bool { return indexedPVs(b.index.Volume(id)) == 1 })

	if _, err := b.fence.Reconcile(context.Background(), nil); err != nil {
		t.Logf("the leader's pass: %v", err)
	}
	if d := a.disk(id); d.Exported && d.AllowHost == hostA {
		t.Errorf("the leader's reconcile reopened the export to node-a's released, cut-off attachment (%s) once the PV holding its record was deleted", hostA)
	}
}

// A claim counts only on a PV it was committed to. The usual way to
// re-create a Retained PV under a new name is to dump the old one
// (kubectl get pv -o yaml), strip its identity and claimRef, and apply
// it, annotations included. A dump taken while node-a held the volume
// carries node-a's claim; applied after node-a's detach (its claim
// released and its record removed), it brings the released attachment
// back, nonce and all, on a PV the claim does not name (it names no PVs,
// committed with one, or PVs that do not include this one). Taken as
// live, it would let the leader's reconcile open the export to a host
// whose detach was answered, or that was fenced, reconnecting within
// ctrl_loss_tmo with its queued writes; and the claim, standing on no
// VolumeAttachment, would block every other node's publish of the volume
// for good, reported as orphaned and never released.
//
// Interleaving:
//  1. a publishes X (PV p1) to node-a: n1, export open to H1. The admin
//     dumps p1.
//  2. node-a is detached: n1 released, the export closed, the record
//     removed.
//  3. The admin applies the dump as p2 (same handle).
//  4. The leader (b) runs its reconcile (Fence.Reconcile).
func TestPVRecreatedFromADumpDoesNotBringBackAReleasedClaim(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const name = "pvc-2f000000-0000-4000-8000-0000000002b7"
	id := a.newVolume(client, name, corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	h1 := a.hostOf(id, "node-a")
	ctx := context.Background()
	dump, err := client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, a, id)
	if len(claimsOf(t, client, name)) != 0 || len(retiringOf(t, client, name)) != 0 {
		t.Fatalf("scripting: the detach should leave no claim and no record")
	}
	p2 := testPV(name+"-recreated", id, corev1.ReadWriteOnce, false)
	p2.Annotations = dump.Annotations
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, p2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the leader's index to know the re-created PV", func() bool { return indexedPVs(b.index.Volume(id)) == 2 })

	if _, err := b.fence.Reconcile(ctx, nil); err != nil {
		t.Logf("the leader's pass: %v", err)
	}
	if d := a.disk(id); d.Exported && d.AllowHost == h1 {
		t.Errorf("the leader's reconcile reopened the export to node-a's released attachment %s, brought back by a PV re-created from a dump", h1)
	}
}

// A PV name is not an identity. Claim.PVs (and a record's PVs) name
// PersistentVolumes by name only, and an unpublish follows every PV a
// record names (ControllerUnpublishVolume appends r.PVs): there it
// releases only a claim of this handle's attachment, on a PV that still
// belongs to this handle. The duplicate PV of a re-created Retained
// volume is deleted (the admin cleans up), and a statically provisioned
// PV for another volume is created under that name: a release there would
// take the claim of a live attachment of ANOTHER volume, the leader would
// then close that volume's export under its healthy, writing node (a
// false fence), and the volume would count as free, so another node's
// publish of it would be let in while the first still holds it.
//
// Interleaving (node-a holds both volumes):
//  1. Volume X has PVs p1 and p2 (a Retained PV re-created); a publishes
//     X to node-a: the claim on p1 and p2 names [p1 p2].
//  2. p2 is deleted; a PV named p2 is created for volume Y; Y is
//     published to node-a (its claim on p2).
//  3. X is detached from node-a: the unpublish releases p1, and its
//     record names p2, now Y's.
//  4. The leader (b) runs its pass.
func TestUnpublishDoesNotReleaseAnotherVolumesClaimOnAReusedPVName(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const nameX = "pvc-2f000000-0000-4000-8000-0000000002b1"
	idX, pvs := twoPVVolume(t, a, b, client, nameX)
	p2 := nameX + "-recreated"
	ctx := context.Background()
	if err := client.CoreV1().PersistentVolumes().Delete(ctx, p2, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both replicas to see the duplicate PV deleted", func() bool {
		return indexedPVs(a.index.Volume(idX)) == 1 && indexedPVs(b.index.Volume(idX)) == 1
	})
	resp, err := a.cs.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-2f000000-0000-4000-8000-0000000002b2", VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	if err != nil {
		t.Fatal(err)
	}
	idY := resp.Volume.VolumeId
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, testPV(p2, idY, corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both replicas to index volume Y on the reused PV name", func() bool {
		return a.index.Volume(idY).Indexed() && b.index.Volume(idY).Indexed()
	})
	if _, err := a.publish(idY, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	hostY := hostOn(t, a, client, idY, p2, "node-a")
	wantExport(t, a, idY, true, hostY)
	if c := claimsOf(t, client, pvs[0])["node-a"]; len(c.PVs) != 2 {
		t.Fatalf("scripting: X's claim should name both PVs: %+v", c)
	}

	if err := a.unpublish(idX, nodeA); err != nil {
		t.Fatalf("X's unpublish from node-a: %v", err)
	}
	if !has(claimsOf(t, client, p2), "node-a") {
		t.Errorf("the unpublish of volume %s released node-a's live claim on volume %s (PV %s, a name X's claim named); records there: %+v", idX, idY, p2, retiringOf(t, client, p2))
	}
	live := has(claimsOf(t, client, p2), "node-a")
	waitFor(t, "the leader's index to follow PV "+p2, func() bool {
		v := b.index.Volume(idY)
		return v.Indexed() && v.Claims.Has("node-a") == live
	})
	if _, err := b.fence.Reconcile(ctx, nil); err != nil {
		t.Logf("the leader's pass: %v", err)
	}
	if d := a.disk(idY); !d.Exported || d.AllowHost != hostY {
		t.Errorf("volume %s's export is exported=%t %q under node-a's live attachment %s: cut off", idY, d.Exported, d.AllowHost, hostY)
	}
	// node-a's VolumeAttachment of Y stands; a second writer must be
	// refused.
	if _, err := b.publish(idY, nodeB, rwo); err == nil {
		t.Errorf("node-b's publish of ReadWriteOnce volume %s succeeded while node-a's attachment stands: two writers", idY)
	}
}

// A repeated publish of a live attachment keeps its nonce (and so its
// host NQN) and its connection, also after a PV was created for the
// handle while the volume is attached (a Retained PV re-created under a
// new name, e.g. ahead of a move to another namespace). That PV starts
// with no claims, so the attachment's claim is on one PV of two; taken
// for "a claim only a stale PV showed", the repeated publish of the same
// VolumeAttachment (an answer lost to a timeout, an attacher restart that
// re-syncs it) would replace its own attachment: cut the export (a drop),
// make a new nonce and move the export to a new host NQN, while the node
// is staged with the first NQN and the kubelet does not stage again on a
// new publish_context: a false fence of a healthy, staged node.
//
// Interleaving:
//  1. a publishes X (one PV, p1) to node-a: n1, export open to H1; the
//     node stages with H1.
//  2. p2 is created for X's handle (no claims).
//  3. The attacher publishes the same VolumeAttachment again.
func TestRepublishAfterASecondPVKeepsTheLiveAttachment(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const name = "pvc-2f000000-0000-4000-8000-0000000002b4"
	id := a.newVolume(client, name, corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	resp, err := a.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	h1 := resp.PublishContext[PublishContextHostNQN]
	wantExport(t, a, id, true, h1)
	drops := a.drops(id)
	if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), testPV(name+"-recreated", id, corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replica to know both PVs", func() bool { return indexedPVs(a.index.Volume(id)) == 2 })

	resp, err = a.publish(id, nodeA, rwo) // the same VolumeAttachment
	if err != nil {
		t.Fatalf("the repeated publish: %v", err)
	}
	if h := resp.PublishContext[PublishContextHostNQN]; h != h1 {
		t.Errorf("the repeated publish of node-a's live attachment answered host NQN %s; the node is staged with %s", h, h1)
	}
	if n := a.drops(id) - drops; n != 0 {
		t.Errorf("the repeated publish dropped node-a's live connection %d time(s) (export now exported=%t %s)", n, a.disk(id).Exported, a.disk(id).AllowHost)
	}
}

// node-a's former attachment n1 is half released (its record on p1, its
// claim still on p2: the detach failed on p2 and the replica stopped);
// node-a is attached again. The publish takes n1 for a claim only a stale
// PV shows (not on every PV): a new attachment n2 with its own NQN, n1
// replaced on p2 with a record there. The export opens to n2, and the
// leader's pass (completeReleases, then the reconcile) leaves it open,
// removes both records and cuts nothing.
func TestNewAttachmentWhileTheFormerIsHalfReleased(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id, pvs := twoPVVolume(t, a, b, client, "pvc-2f000000-0000-4000-8000-0000000002b5")
	h1 := hostOn(t, a, client, id, pvs[1], "node-a")
	unpublishFailingOn(t, a, client, id, pvs[1])
	waitFor(t, "replica b's index to see the half release", func() bool {
		v := b.index.Volume(id)
		for _, pv := range v.PVs {
			if pv.Name == pvs[0] && pv.Claims.Has("node-a") {
				return false
			}
		}
		return len(b.index.Retiring()) == 1
	})
	resp, err := b.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatalf("node-a's new attachment: %v", err)
	}
	h2 := resp.PublishContext[PublishContextHostNQN]
	if h2 == h1 || h2 == "" {
		t.Fatalf("the new attachment answered %q (the former was %s)", h2, h1)
	}
	wantExport(t, b, id, true, h2)
	drops := b.drops(id)
	b.waitClaims(id, "node-a")
	waitFor(t, "replica b's index to see the commit on both PVs", func() bool {
		for _, pv := range b.index.Volume(id).PVs {
			if c, ok := pv.Claims.Get("node-a"); !ok || b.fence.HostOf(id, "node-a", c) != h2 {
				return false
			}
		}
		return true
	})
	if _, err := b.fence.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	wantExport(t, b, id, true, h2)
	if n := b.drops(id) - drops; n != 0 {
		t.Errorf("the leader's pass dropped node-a's new attachment %d time(s)", n)
	}
	for _, pv := range pvs {
		if c := claimsOf(t, client, pv)["node-a"]; b.fence.HostOf(id, "node-a", c) != h2 {
			t.Errorf("%s: node-a's claim %+v is not the new attachment", pv, c)
		}
		if recs := retiringOf(t, client, pv); len(recs) != 0 {
			t.Errorf("records left on %s: %+v", pv, recs)
		}
	}
}
