package csi

import (
	"context"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// A node may have a newer attachment of a volume by the time a step
// decided on its former attachment runs (a paused replica, a slow first
// RDS command, a node deleted and re-created). Every cut and every
// release names the attachment it is for (its nonce), not the node: such
// a step never cuts, drops or releases the node's newer attachment.

// A fence whose change after the release failed leaves the change to the
// leader. When the fenced node recovers and is published again before
// the leader makes it, the new attachment (a new nonce, the same node
// incarnation) stands: the leader's change treats only the released
// attachment as gone. Before the record named the attachment, the retry
// of a failed Settle excluded every claim of the node's incarnation, so it
// closed the export under the node's new attachment: a false fence of a
// healthy node.
func TestLeaderRetirementLeavesTheNodesNewAttachmentAlone(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000101", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	taintNode(t, client, "node-a", fencing.OutOfServiceTaint, "nodeshutdown")
	fenceWithFailedSettle(t, a, id, "node-a")
	if recs := retiringOf(t, client, id); len(recs) != 1 || recs[0].Node != "node-a" || recs[0].Nonce == "" {
		t.Fatalf("retiring attachments after the fence: %+v; want node-a's, by its nonce", recs)
	}

	// node-a recovers and is published again: a new attachment.
	n, err := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = nil
	if _, err := client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node-a back in service in replica a's index", func() bool { return !a.index.Node("node-a").OutOfService })
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	host := a.hostOf(id, "node-a")
	wantExport(t, a, id, true, host)
	drops := a.drops(id)

	// The leader (replica b) makes the change after the fence's release.
	waitFor(t, "replica b's index to list the retiring attachment", func() bool { return len(b.index.Retiring()) == 1 })
	if _, err := b.fence.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	wantExport(t, a, id, true, host)
	if n := a.drops(id) - drops; n != 0 {
		t.Errorf("the leader's change after the fence dropped node-a's new attachment %d time(s): a false fence of a healthy node", n)
	}
	if recs := retiringOf(t, client, id); len(recs) != 0 {
		t.Errorf("retiring attachments after the leader's pass: %+v; want none", recs)
	}
}

// A late unpublish of node-a's former attachment (its new attachment's
// VolumeAttachment is live) finds the record of the former one, left by a
// replica that stopped before the change after the release; it clears
// the record without a false fence of the new attachment (the export
// stays open to it, no connection dropped).
func TestLateUnpublishOfAFormerAttachmentKeepsTheNewOne(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000001a6", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	a.dropAutoVA(id, nodeA)
	releaseAndStop(t, a, id)
	a.waitClaims(id)
	b.waitClaims(id)
	// node-a's new attachment.
	if _, err := b.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	host := b.hostOf(id, "node-a")
	wantExport(t, b, id, true, host)
	drops := b.drops(id)
	b.waitClaims(id, "node-a")
	if recs := retiringOf(t, client, id); len(recs) != 1 {
		t.Fatalf("scripting: the record of the former attachment should be left: %+v", recs)
	}
	// The late unpublish of the former attachment, called directly: the
	// VolumeAttachment of the new one stands.
	if _, err := b.cs.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeA}); err != nil {
		t.Fatal(err)
	}
	wantExport(t, b, id, true, host)
	if n := b.drops(id) - drops; n != 0 {
		t.Errorf("the late unpublish dropped node-a's new attachment %d time(s)", n)
	}
	if !has(claimsOf(t, client, id), "node-a") {
		t.Error("the late unpublish released the new attachment's claim")
	}
	if recs := retiringOf(t, client, id); len(recs) != 0 {
		t.Errorf("records after the late unpublish: %+v; want the former attachment's removed", recs)
	}
}

// The cut an unpublish makes before its release (shutOut) excludes the
// attachment whose release it precedes, not every claim of the node. A
// replica paused after it read the PV and the VolumeAttachment (the old
// claim, the VolumeAttachment gone) and before its cut resumes after the
// node's detach was completed elsewhere and the node was attached again:
// a cut of the node would treat the new attachment as departing and close
// the export under it (dropping every connection) before its release
// conflicts, finds the live VolumeAttachment, and the export is reopened:
// a healthy node cut off for nothing.
//
// Interleaving:
//  1. a publishes to node-a (attachment n1, export open to H1).
//  2. node-a's VolumeAttachment is deleted; a's unpublish reads the PV
//     (n1) and the VolumeAttachment (gone) and pauses before its cut
//     (held on its first RDS read).
//  3. The attacher's retry is served by b: n1 released, the change
//     after it made, answered. node-a is attached again through b (n2,
//     export open to H2).
//  4. a resumes.
func TestPausedUnpublishDoesNotCutTheNodesNewAttachment(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000001a8", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	a.dropAutoVA(id, nodeA)
	paused := a.rds.holdNext("GetDisk")
	done := make(chan error, 1)
	go func() {
		_, err := a.cs.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeA})
		done <- err
	}()
	<-paused.entered

	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	b.waitClaims(id)
	if _, err := b.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	host := b.hostOf(id, "node-a")
	wantExport(t, b, id, true, host)
	drops := b.drops(id)

	close(paused.release)
	if err := <-done; err != nil {
		t.Logf("the paused unpublish: %v", err)
	}
	if n := b.drops(id) - drops; n != 0 {
		t.Errorf("the paused unpublish of node-a's former attachment dropped its new attachment's connections %d time(s) (export now exported=%t %s)", n, b.disk(id).Exported, b.disk(id).AllowHost)
	}
	if !has(claimsOf(t, client, id), "node-a") {
		t.Error("the paused unpublish released node-a's new claim")
	}
}

// A fence's cut (CutOff, before ReleaseIfStale's release) excludes the
// stale attachment the fence read, not whichever attachment the node has
// by the time the cut runs. A fence of a deleted-and-re-created node's
// old attachment that is slow to reach the RDS (paused replica, a slow
// first RDS command) runs after the new incarnation was published (its
// publish replaced the old attachment, cutting it itself): it leaves the
// new attachment's export and connections alone. Its release then
// conflicts, re-reads the claim (the new incarnation's, not stale) and
// keeps it. A cut of the new attachment would be a false fence of a
// healthy node, its I/O failing after fast_io_fail_tmo.
//
// Interleaving:
//  1. a publishes to node-a (incarnation uid-1; attachment n1).
//  2. node-a is deleted and re-created (uid-2). a's fencer reads the PV
//     (n1, uid-1), reads the Node live (uid-2: stale), and its cut is
//     held on its first RDS read.
//  3. b publishes to node-a (uid-2): it replaces its own old attachment
//     (cut, commit n2, open to H2) and answers.
//  4. The fence's cut resumes.
func TestSlowFenceDoesNotCutTheRecreatedNodesAttachment(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, nodeWithUID("node-a", "uid-1"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000001a9", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	recreateNodeA(t, client, a, b)

	paused := a.rds.holdNext("GetDisk")
	type result struct {
		released bool
		err      error
	}
	done := make(chan result, 1)
	go func() {
		released, err := a.fenceNode(ctx, id, "node-a")
		done <- result{released, err}
	}()
	<-paused.entered

	if _, err := b.publish(id, nodeA, rwo); err != nil {
		t.Fatalf("scripting: the new incarnation's publish: %v", err)
	}
	host := b.hostOf(id, "node-a")
	wantExport(t, b, id, true, host)
	drops := b.drops(id)

	close(paused.release)
	r := <-done
	t.Logf("the slow fence: released=%t, %v", r.released, r.err)
	if n := b.drops(id) - drops; n != 0 {
		t.Errorf("the slow fence of node-a's old incarnation dropped the new incarnation's attachment %d time(s)", n)
	}
	if d := b.disk(id); !d.Exported || d.AllowHost != host {
		t.Errorf("after the slow fence, the export is exported=%t %q under node-a's live attachment %s (claims %v): cut off until the next reconcile", d.Exported, d.AllowHost, host, keys(claimsOf(t, client, id)))
	}
}

// A publish that replaces its node's own earlier attachment (the node was
// deleted and re-created) cuts the attachment it decided on, not whatever
// claim the node has when the cut runs. Two publishes of the same
// VolumeAttachment on two replicas (an attacher that paused and lost its
// lease, and the new leader's attacher): the first to reach the RDS
// replaces the old attachment and answers n2; the other, which decided on
// the old claim, must not then close the export under n2 (dropping its
// connections) before its commit conflicts and its retry reopens the
// export to n2.
//
// Interleaving:
//  1. a publishes to node-a (uid-1; n1); node-a is deleted and
//     re-created (uid-2).
//  2. a's publish of node-a decides "replaces its own attachment" and is
//     held on its first RDS read (the cut).
//  3. b's publish of node-a replaces n1 with n2 and answers.
//  4. a's publish resumes.
func TestConcurrentReplacingPublishDoesNotCutTheAnsweredAttachment(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, nodeWithUID("node-a", "uid-1"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000001ac", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	recreateNodeA(t, client, a, b)

	paused := a.rds.holdNext("GetDisk")
	done := make(chan error, 1)
	go func() {
		_, err := a.cs.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
		done <- err
	}()
	<-paused.entered
	if _, err := b.publish(id, nodeA, rwo); err != nil {
		t.Fatalf("scripting: b's publish: %v", err)
	}
	host := b.hostOf(id, "node-a")
	wantExport(t, b, id, true, host)
	drops := b.drops(id)

	close(paused.release)
	err := <-done
	t.Logf("a's publish: %v", err)
	if n := b.drops(id) - drops; n != 0 {
		t.Errorf("a's publish, decided on the old attachment, dropped the answered attachment %s %d time(s)", host, n)
	}
}

// An unpublish follows the handle's PVs and, on each PV after the first,
// releases the claim of the attachment it is for, not whatever claim the
// node has there whenever the node's VolumeAttachment (checked by name:
// volume and node) is gone or being deleted. A paused unpublish of the
// node's FORMER attachment n1 that resumes after the node was attached
// again (n2) leaves n2's claim alone, so n2's own unpublish, a forced one
// (the node NotReady), finds n2 claimed and cuts it. Released uncut on
// the second PV, n2 would be retired on every PV by that release's
// record, the change after it would move nothing (the export allows the
// migration target, a live holder: left as is), and the cut of n2's own
// unpublish (shutOut, named n2) would find n2 no longer claimed and skip
// it: a force-detached migration source left connected, writing, next to
// the target, after its detach was answered (nvmet checks the allowed
// host at connect only, and n2 connected while the export allowed it).
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
func TestPausedUnpublishLeavesTheNewerAttachmentToItsOwnCut(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
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

	// 3. node-a's new attachment, then the migration to node-b. Replica b
	// first sees both PVs as they are (a's publish on both, its release on
	// the first), or its publish, deciding on what its informers have yet
	// to deliver, may conflict past its attempts.
	b.waitCaughtUp(id)
	if _, err := b.publish(id, nodeA, rwx); err != nil {
		t.Fatalf("node-a's new attachment: %v", err)
	}
	h2 := b.hostOf(id, "node-a")
	b.waitClaims(id, "node-a")
	b.waitCaughtUp(id)
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
	b.waitCaughtUp(id)
	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatalf("n2's unpublish: %v", err)
	}
	if n := b.drops(id) - drops; n == 0 {
		t.Errorf("node-a's attachment n2 (%s), a migration source force-detached while NotReady, was never cut off: its connection stays; export now %s", h2, b.disk(id).AllowHost)
	}
}
