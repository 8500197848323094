package csi

// Outside review of 08609a9 (storage fencing: records keep their
// attachment out on every PV until no PV claims it; Claim.PVs names the
// PVs a claim was committed to and an unpublish follows them; the leader
// completes releases; every cut names the attachment). Tests marked HOLE
// fail on 08609a9; tests marked HELD were tried and pass.
//
// Roots behind the holes:
//   - a PV name in Claim.PVs / Retiring.PVs is followed without checking
//     that the PV read is still one of the handle's (a PV deleted and its
//     name reused for another volume): an unpublish of one volume
//     releases another volume's live claim (PVNameReused...);
//   - a record lives on one PV only: deleting that PV (the duplicate of
//     a re-created Retained PV, cleaned up) loses it while another PV
//     still shows the released attachment (RecordLostWithItsPV);
//   - a claim is taken as live on whatever PV it is found: a PV
//     re-created from a dump brings back a released attachment
//     (PVRecreatedFromADump), and a PV created while the volume is
//     attached makes the live claim look stale, so a repeated publish
//     replaces (cuts) it (RepublishAfterASecondPV);
//   - a publish that replaces its node's own attachment records no
//     release of it (ReplacedOwnAttachmentHasNoRecord);
//   - an unpublish's release on the PVs after the first is checked
//     against the node's VolumeAttachment by name, not against the
//     attachment it is for, and runs no cut: a paused one releases the
//     node's newer attachment uncut, and its record then makes that
//     attachment's own cut skip it (PausedUnpublishReleasesTheNewer...).

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// unpublishFailingOn unpublishes id from node-a on e with the first PATCH
// of PV pv failing (an API error): the release reaches the handle's other
// PV, not pv, and the unpublish fails (the attacher retries it later).
func unpublishFailingOn(t *testing.T, e *publishEnv, client *fake.Clientset, id, pv string) {
	t.Helper()
	failed := false
	client.PrependReactor("patch", "persistentvolumes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.(k8stesting.PatchAction).GetName() != pv || failed {
			return false, nil, nil
		}
		failed = true
		return true, nil, apierrors.NewInternalError(context.DeadlineExceeded)
	})
	if err := e.unpublish(id, nodeA); err == nil || !failed {
		t.Fatalf("scripting: the unpublish should fail on PV %s: %v", pv, err)
	}
}

// HOLE (a live attachment of ANOTHER volume loses its claim: the leader
// then closes that volume's export under its healthy, writing node (a
// false fence), and the volume counts as free, so another node's publish
// of it is let in while the first still holds it): Claim.PVs (and the
// record's PVs) name PersistentVolumes by name only. An unpublish follows
// every PV a record names (ControllerUnpublishVolume appends r.PVs) and
// calls ReleaseUnpublished there with this volume's handle and the node.
// ReleaseUnpublished drops the node's claim on that PV whatever
// attachment, whatever volume, it is: it checks only that the
// VolumeAttachment of (THIS handle, node) is gone, never that the PV still
// belongs to this handle, nor that the claim is the attachment the record
// names. A PV name is not an identity: the duplicate PV of a re-created
// Retained volume is deleted (the admin cleans up), and a statically
// provisioned PV for another volume is created under that name.
//
// Interleaving (node-a holds both volumes):
//  1. Volume X has PVs p1 and p2 (a Retained PV re-created); a publishes
//     X to node-a: the claim on p1 and p2 names [p1 p2].
//  2. p2 is deleted; a PV named p2 is created for volume Y; Y is
//     published to node-a (its claim on p2).
//  3. X is detached from node-a: the unpublish releases p1, its record
//     names p2, so it follows p2 and drops node-a's claim there: Y's.
//  4. The leader (b) runs its pass.
func TestReview2PVNameReusedForAnotherVolumeUnpublishReleasesItsClaim(t *testing.T) {
	a, b, client := newReviewReplicas(t, testNode("node-a"), testNode("node-b"))
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

// HELD: node-a's former attachment n1 is half released (its record on
// p1, its claim still on p2: the detach failed on p2 and the replica
// stopped); node-a is attached again. The publish takes n1 for a claim
// only a stale PV shows (not on every PV): a new attachment n2 with its
// own NQN, n1 replaced on p2 with a record there. The export opens to
// n2, and the leader's pass (completeReleases, then the reconcile)
// leaves it open, removes both records and cuts nothing.
func TestReview2NewAttachmentWhileTheFormerIsHalfReleased(t *testing.T) {
	a, b, client := newReviewReplicas(t, testNode("node-a"))
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

// failGetDiskAt makes the n-th GetDisk from now on fail (an RDS that
// stopped answering).
func failGetDiskAt(f *fakeRDS, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := 0
	f.atCall = func(method string) {
		if method != "GetDisk" {
			return
		}
		if seen++; seen == n {
			f.fail[method] = errors.New("ssh: the RDS stopped answering")
		}
	}
}

// HOLE (the replaced attachment of a deleted node incarnation, still
// connected with queued writes, e.g. a VM the cloud deleted the Node of
// but that still runs, is let in again after its claim was replaced, for
// up to the reconcile period, --export-reconcile-period, 1 min, instead
// of the few seconds the records promise): a publish that replaces its
// node's own earlier attachment (another incarnation) cuts it off and
// replaces its claim in the commit, but the commit writes NO retiring
// record for it (Commit records only the fenced nodes' claims). When the
// export change after the commit fails (or the replica stops there), an
// open of the replaced attachment that another replica decided between
// the cut and the commit (the leader's reconcile read the cut's state,
// then the claims with the old attachment still in them) lands late:
// the export is open to the replaced attachment, and the leader's
// RetireMarked, which runs every few seconds to undo exactly this,
// finds nothing to do. A fenced node's claim released by the same
// commit leaves a record, and is handled within seconds.
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
func TestReview2ReplacedOwnAttachmentHasNoRecord(t *testing.T) {
	a, b, client := newReviewReplicas(t, nodeWithUID("node-a", "uid-1"))
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

// HOLE (a force-detached migration source stays connected, writing, next
// to the target, after its detach was answered: a fenced attachment left
// connected; the cut for it is skipped as "no longer claimed"): an
// unpublish follows the handle's PVs and releases, on each PV after the
// first, whatever claim the node has there, without a cut (before is
// nil once released), as long as the node's VolumeAttachment is gone or
// being deleted. That VolumeAttachment is checked by name (volume and
// node), not as the attachment the unpublish is for: a paused unpublish
// of the node's FORMER attachment n1 resumes and releases, on the second
// PV, the node's NEWER attachment n2, whose own detach (forced, the node
// NotReady) is under way. Its record now retires n2 on every PV, so the
// change after that release moves nothing (the export allows the
// migration target, a live holder: left as is), and the cut of n2's own
// unpublish (shutOut, named n2) finds n2 no longer claimed and skips
// it. Nothing ever drops n2's connection: nvmet checks the allowed host
// at connect only, and n2 connected while the export allowed it.
//
// Interleaving (ReadWriteMany block volume, PVs p1 and p2; replica a's
// unpublish is scripted step by step as ControllerUnpublishVolume runs
// it):
//  1. a publishes to node-a (n1 on p1 and p2).
//  2. node-a's VolumeAttachment is deleted; a's unpublish releases n1 on
//     p1 (node-a Ready: graceful) and pauses before p2.
//  3. node-a is attached again through b: n2 on p1 and p2, export open
//     to H2, node-a connects. A live migration to node-b starts: the
//     export moves to node-b's host without a drop (node-a keeps its
//     connection, as a migration source does).
//  4. node-a goes NotReady; its VolumeAttachment is deleted (forced).
//  5. a's unpublish resumes: on p2 it releases n2 (no cut), and makes the
//     change after its releases.
//  6. The attacher's unpublish of n2 is served by b.
func TestReview2PausedUnpublishReleasesTheNewerAttachmentWithoutACut(t *testing.T) {
	a, b, client := newReviewReplicas(t, testNode("node-a"), testNode("node-b"))
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	const name = "pvc-2f000000-0000-4000-8000-0000000002b8"
	id := a.newVolume(client, name, corev1.ReadWriteMany, true)
	ctx := context.Background()
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, testPV(name+"-recreated", id, corev1.ReadWriteMany, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both replicas to know both PVs", func() bool {
		return indexedPVs(a.index.Volume(id)) == 2 && indexedPVs(b.index.Volume(id)) == 2
	})
	var pvs []string
	for _, pv := range a.index.Volume(id).PVs {
		pvs = append(pvs, pv.Name)
	}
	if _, err := a.publish(id, nodeA, rwx); err != nil {
		t.Fatal(err)
	}

	// 2. a's unpublish of n1 reaches its first PV (released there, the
	// node Ready: graceful) and pauses before the second.
	first := a.index.Volume(id).PVName
	second := pvs[0]
	if second == first {
		second = pvs[1]
	}
	pvs = []string{first, second}
	a.dropAutoVA(id, nodeA)
	paused := holdReleaseOfSecondPV(a.own, first, second)
	unpublished := make(chan error, 1)
	go func() {
		_, err := a.cs.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeA})
		unpublished <- err
	}()
	<-paused.entered
	if has(claimsOf(t, client, pvs[0]), "node-a") {
		t.Fatalf("scripting: a's unpublish should have released node-a's claim on %s", pvs[0])
	}

	// 3. node-a's new attachment, then the migration to node-b.
	waitFor(t, "replica b's index to see the release on "+pvs[0], func() bool {
		for _, pv := range b.index.Volume(id).PVs {
			if pv.Name == pvs[0] && pv.Claims.Has("node-a") {
				return false
			}
		}
		return true
	})
	if _, err := b.publish(id, nodeA, rwx); err != nil {
		t.Fatalf("node-a's new attachment: %v", err)
	}
	h2 := b.hostOf(id, "node-a")
	b.waitClaims(id, "node-a")
	if _, err := b.publish(id, nodeB, rwx); err != nil {
		t.Fatalf("the migration target: %v", err)
	}
	wantExport(t, b, id, true, b.hostOf(id, "node-b"))
	b.waitClaims(id, "node-a", "node-b")
	drops := b.drops(id)

	// 4. node-a NotReady, its VolumeAttachment deleted (forced).
	setReady(t, client, "node-a", corev1.ConditionUnknown, time.Now())
	b.dropAutoVA(id, nodeA)

	// 5. a's unpublish resumes on its second PV, and makes the change
	// after its releases.
	close(paused.release)
	if err := <-unpublished; err != nil {
		t.Logf("a's unpublish: %v", err)
	}
	if !has(claimsOf(t, client, pvs[1]), "node-a") {
		t.Errorf("a's resumed unpublish of n1 released node-a's newer attachment n2 (%s) on %s", h2, pvs[1])
	}

	// 6. n2's own unpublish.
	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatalf("n2's unpublish: %v", err)
	}
	if n := b.drops(id) - drops; n == 0 {
		t.Errorf("node-a's attachment n2 (%s), a migration source force-detached while NotReady, was never cut off: its connection stays; export now %s", h2, b.disk(id).AllowHost)
	}
}

// HELD: a release that reached one PV of two (the unpublish failed on
// the second, node-a out of service, so its cut closed the export to
// state T1), and an open of node-a's attachment conditioned on T1 in
// flight (decided before the release). The leader's pass completes the
// release on the second PV, changes the state once more and removes both
// records; the late open then matches nothing.
func TestReview2LateOpenAfterTheLeaderCompletesAHalfRelease(t *testing.T) {
	a, b, client := newReviewReplicas(t, testNode("node-a"))
	id, pvs := twoPVVolume(t, a, b, client, "pvc-2f000000-0000-4000-8000-0000000002b9")
	h1 := hostOn(t, a, client, id, pvs[1], "node-a")
	taintNode(t, client, "node-a", fencing.OutOfServiceTaint, "nodeshutdown")
	unpublishFailingOn(t, a, client, id, pvs[1])
	d := a.disk(id)
	t1 := rds.StateOf(&d)
	if t1.Open {
		t.Fatalf("scripting: the cut should have closed the export: %s", t1)
	}
	waitFor(t, "the leader's index to list the record", func() bool { return len(b.index.Retiring()) == 1 })
	if _, err := b.fence.RetireMarked(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if has(claimsOf(t, client, pvs[1]), "node-a") {
		t.Errorf("the leader's pass left node-a's released attachment claimed on %s", pvs[1])
	}
	for _, pv := range pvs {
		if recs := retiringOf(t, client, pv); len(recs) != 0 {
			t.Errorf("records left on %s: %+v", pv, recs)
		}
	}
	if _, err := a.rds.SwapExport(context.Background(), id, t1, rds.ExportState{Open: true, Host: h1}); err == nil {
		t.Errorf("the late open of node-a's released attachment %s landed after the leader's pass", h1)
	}
	wantClosed(t, a, id)
}

// HOLE (a false fence of a healthy, staged node: its connection is
// dropped and the export moved to a NEW host NQN it does not connect
// with; its I/O fails until the volume is unstaged and staged again): a
// repeated publish of a live attachment keeps its nonce (and so its host
// NQN) only when the claim is on every PV of the handle (onEveryPV). A PV
// created for the handle while the volume is attached (a Retained PV
// re-created under a new name, e.g. ahead of a move to another
// namespace) starts with no claims, so the attachment's claim is on one
// PV of two: the repeated publish of the same VolumeAttachment (an answer
// lost to a timeout, an attacher restart that re-syncs it) takes the
// claim for "a claim only a stale PV showed", replaces its own
// attachment: cuts the export (a drop), makes a new nonce and moves the
// export to a new host NQN. The node is staged with the first NQN; the
// kubelet does not stage again on a new publish_context.
//
// Interleaving:
//  1. a publishes X (one PV, p1) to node-a: n1, export open to H1; the
//     node stages with H1.
//  2. p2 is created for X's handle (no claims).
//  3. The attacher publishes the same VolumeAttachment again.
func TestReview2RepublishAfterASecondPVReplacesTheLiveAttachment(t *testing.T) {
	a, b, client := newReviewReplicas(t, testNode("node-a"))
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

// HOLE (a force-detached, cut-off attachment is let in again in the
// middle of its detach; its kernel reconnects within ctrl_loss_tmo and
// its queued writes land): the record of a release lives on the PV where
// the release happened. When the release reached one PV of the handle
// and not the other (the attacher retries the detach with backoff), and
// that PV is deleted meanwhile (the old duplicate of a re-created
// Retained PV, cleaned up), the record goes with it: nothing treats the
// attachment the other PV still shows as retired. The leader's reconcile
// re-derives the export from the remaining PV and opens it to the
// released attachment.
//
// Interleaving (node-a out of service: a forced detach, which cuts):
//  1. a publishes X (PVs p1 p2) to node-a: export open to H(a).
//  2. The unpublish cuts H(a) off, releases p1 (+record on p1), and its
//     PATCH of p2 fails: the detach is retried later.
//  3. p1 is deleted.
//  4. The leader (b) runs its reconcile (Fence.Reconcile) before the retry.
func TestReview2RecordLostWithItsPVLeaderReopens(t *testing.T) {
	a, b, client := newReviewReplicas(t, testNode("node-a"))
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

// HOLE (a released attachment is let in again: a host whose detach was
// answered, or that was fenced, reconnects within ctrl_loss_tmo with its
// queued writes; and the resurrected claim, standing on no
// VolumeAttachment, blocks every other node's publish of the volume for
// good, reported as orphaned and never released): the usual way to
// re-create a Retained PV under a new name is to dump the old one
// (kubectl get pv -o yaml), strip its identity and claimRef, and apply
// it, annotations included. A dump taken while node-a held the volume
// carries node-a's claim; applied after node-a's detach (its claim
// released and its record removed), it brings the released attachment
// back, nonce and all. Nothing checks a claim against the PV it is found
// on: the claim names no PVs (committed with one), or names PVs that do
// not include this one, yet liveClaims takes it as live, and the
// leader's reconcile opens the export to it.
//
// Interleaving:
//  1. a publishes X (PV p1) to node-a: n1, export open to H1. The admin
//     dumps p1.
//  2. node-a is detached: n1 released, the export closed, the record
//     removed.
//  3. The admin applies the dump as p2 (same handle).
//  4. The leader (b) runs its reconcile (Fence.Reconcile).
func TestReview2PVRecreatedFromADumpResurrectsAReleasedClaim(t *testing.T) {
	a, b, client := newReviewReplicas(t, testNode("node-a"))
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
