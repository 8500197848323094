package csi

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Any RDS command may land up to its timeout late, after later ones. An
// export change is a compare-and-swap on the state it read, and every
// retirement (an unpublish, a fence, the leader's completion of a
// release) changes that state before it is answered: a late open or cut
// decided before it then matches nothing. Each test holds or times out
// one command, lets the rest of the sequence complete, then lands it.

// A slow "open to node A" lands after A's unpublish and B's publish: it
// must not move the export back to A, and A must not be told it may write.
func TestLateOpenAfterUnpublishAndNextPublish(t *testing.T) {
	a, b, client := newTwoFencedReplicas(t, "node-a", "node-b")
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-21000000-0000-4000-8000-000000000001", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)

	slow := a.rds.holdNext("SwapExport")
	answered := make(chan error, 1)
	go func() { _, err := a.publish(id, nodeA, rwo); answered <- err }()
	<-slow.entered // A's claim is committed; its open is in flight

	// The detach of A, then B's attach, on the other replica.
	a.dropAutoVA(id, nodeA)
	b.waitClaims(id, "node-a")
	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	b.waitClaims(id)
	if _, err := b.publish(id, nodeB, rwo); err != nil {
		t.Fatal(err)
	}
	hostB := b.hostOf(id, "node-b")
	wantExport(t, b, id, true, hostB)

	close(slow.release)
	err := <-answered
	if err == nil {
		t.Fatal("node-a was told it may write after its unpublish")
	}
	wantExport(t, b, id, true, hostB)
}

// ABA: a slow close conditioned on node A's export lands after A was
// unpublished and published again: the new attachment's export stays.
func TestLateCloseAfterRepublish(t *testing.T) {
	a, b, client := newTwoFencedReplicas(t, "node-a")
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-21000000-0000-4000-8000-000000000002", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	first, err := a.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	firstHost := first.PublishContext[PublishContextHostNQN]
	a.waitClaims(id, "node-a")
	b.waitClaims(id, "node-a")

	if err := a.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	b.waitClaims(id)
	resp, err := b.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	host := resp.PublishContext[PublishContextHostNQN]
	wantExport(t, b, id, true, host)
	if host == firstHost {
		t.Fatalf("the second attachment of node-a got the first one's host NQN %s: a late command conditioned on the first export would match it", host)
	}
	// A late close conditioned on the first attachment's export (its real
	// host) lands now: it matches nothing.
	if _, err := b.rds.SwapExport(context.Background(), id, exportOpen(firstHost), exportClosed()); err == nil {
		t.Fatal("a close conditioned on an earlier attachment's export matched the new one")
	}
	wantExport(t, b, id, true, host)
}

// An open in flight cannot land after an unpublish was answered, also
// when the unpublish's change after its release (its settle, made "so
// that no open of the retired attachment that was in flight can land")
// failed: the release's record on the PV (claims.RetiringAnnotation)
// makes the attacher's retry, which finds no claim left, change the
// export before it answers. The interleaving: a repeated publish of the
// same node on the other replica (a paused replica, or a late retry) read
// the tombstone the retirement's cut left and node-a's claim before the
// release; its tombstone -> open(node-a) timed out on its side and stays
// in flight. The unpublish releases, its settle fails, and its replica
// stops there; the retried unpublish is answered; then the open lands.
// Landed, it would let in the retired attachment (whose node,
// force-detached while NotReady, still reconnects with its queued writes)
// until the leader's next reconcile.
func TestLateOpenCannotLandAfterAnUnpublishWhoseSettleFailed(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000005", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	hostA := a.hostOf(id, "node-a")
	b.waitClaims(id, "node-a")

	// Replica b's repeated publish of node-a, held at its export read
	// (its claim commit and VolumeAttachment reads are done).
	q := b.rds.holdNext("GetDisk")
	published := make(chan error, 1)
	go func() {
		_, err := b.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
		published <- err
	}()
	<-q.entered

	// node-a's unpublish on replica a: held once its shutOut closed the
	// export (its second read), before the release.
	r1 := a.rds.holdNext("GetDisk")
	unpublished := make(chan error, 1)
	go func() { unpublished <- a.unpublish(id, nodeA) }()
	<-r1.entered
	r2 := a.rds.holdNext("GetDisk")
	close(r1.release)
	<-r2.entered
	wantClosed(t, a, id)

	// The publish reads the tombstone and node-a's claim; its open times
	// out on its side and stays in flight.
	var late *lateSwap
	a.rds.mu.Lock()
	a.rds.delaySwap = func(s *lateSwap) bool {
		if late == nil && s.to.Open {
			late = s
			return true
		}
		return false
	}
	a.rds.mu.Unlock()
	close(q.release)
	if err := <-published; err == nil {
		t.Fatal("the repeated publish answered success with its open in flight")
	}
	a.rds.mu.Lock()
	a.rds.delaySwap = nil
	sent := late != nil
	a.rds.mu.Unlock()
	if !sent {
		t.Fatal("the repeated publish sent no open")
	}

	// The unpublish goes on: release, then its last change fails, and
	// replica a stops there (it never retries anything; had it died
	// before answering, the attacher would retry the detach on b).
	a.rds.failNext("SwapExport", fmt.Errorf("exporting disk: %w: command timed out after it was sent", rds.ErrOutcomeUnknown))
	close(r2.release)
	if err := <-unpublished; err != nil {
		t.Logf("unpublish on replica a: %v", err)
	}
	if _, held := claimsOf(t, client, id)["node-a"]; held {
		t.Fatal("node-a's claim survived its unpublish")
	}
	// The detach retried on replica b finds no claim to release. Since
	// the fix the release's record on the PV (RetiringAnnotation) makes
	// it change the export before it answers.
	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatalf("the retried unpublish on replica b: %v", err)
	}

	// The open in flight lands.
	a.rds.mu.Lock()
	matched := a.rds.landLocked(late)
	a.rds.mu.Unlock()
	if d := a.disk(id); matched && d.Exported && d.AllowHost == hostA {
		t.Errorf("node-a's unpublish was answered, then a late open conditioned on the tombstone its retirement left landed: the export is open to the retired attachment %s until the next reconcile", hostA)
	}
}

// The same with a fence. The fencer cuts node-a off (CutOff: open(node-a)
// -> a fresh tombstone), releases its claim, then Settle changes the
// state once more "so that no open of the fenced attachment that was in
// flight can land". When Settle fails, the fence returns the error with
// the claim already gone, and the release's record stays on the PV:
// whoever comes next (the fencer's retry, or the leader's pass when the
// fencer's replica stops) makes the change and removes the record. A
// repeated publish of node-a on a replica that paused before the fence
// (its claim commit done) read the tombstone and node-a's claim before
// the release; its tombstone -> open(node-a) times out on its side and
// lands after the fence. Landed, it would let the fenced node, alive
// behind a partition, reconnect and land its queued writes, until the
// leader's next reconcile.
func TestLateOpenCannotLandAfterAFenceWhoseSettleFailed(t *testing.T) {
	for _, stop := range []bool{true, false} {
		name := "the fencer retries"
		if stop {
			name = "the fencer's replica stops"
		}
		t.Run(name, func(t *testing.T) { lateOpenAfterFenceWhoseSettleFailed(t, stop) })
	}
}

func lateOpenAfterFenceWhoseSettleFailed(t *testing.T, stop bool) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000007", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	hostA := a.hostOf(id, "node-a")
	b.waitClaims(id, "node-a")

	// Replica b's repeated publish of node-a pauses at its export read.
	q := b.rds.holdNext("GetDisk")
	published := make(chan error, 1)
	go func() {
		_, err := b.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
		published <- err
	}()
	<-q.entered

	// node-a goes out of service; the fence runs, held after its cut.
	taintNode(t, client, "node-a", fencing.OutOfServiceTaint, "nodeshutdown")
	f1 := a.rds.holdNext("GetDisk")
	fenced := make(chan error, 1)
	go func() {
		released, err := a.fenceNode(context.Background(), id, "node-a")
		if err == nil && !released {
			err = fmt.Errorf("the fence released nothing")
		}
		fenced <- err
	}()
	<-f1.entered
	f2 := a.rds.holdNext("GetDisk")
	close(f1.release)
	<-f2.entered
	wantClosed(t, a, id)

	var late *lateSwap
	a.rds.mu.Lock()
	a.rds.delaySwap = func(s *lateSwap) bool {
		if late == nil && s.to.Open {
			late = s
			return true
		}
		return false
	}
	a.rds.mu.Unlock()
	close(q.release)
	if err := <-published; err == nil {
		t.Fatal("the repeated publish answered success with its open in flight")
	}
	a.rds.mu.Lock()
	a.rds.delaySwap = nil
	sent := late != nil
	a.rds.mu.Unlock()
	if !sent {
		t.Skip("the paused publish sent no open: nothing in flight")
	}

	a.rds.failNext("SwapExport", fmt.Errorf("exporting disk: %w: command timed out after it was sent", rds.ErrOutcomeUnknown))
	close(f2.release)
	err := <-fenced
	t.Logf("the fence: %v", err)
	if _, held := claimsOf(t, client, id)["node-a"]; held {
		t.Fatal("node-a's claim survived its fence")
	}
	// Since the fix the release left its record on the PV
	// (RetiringAnnotation): whoever comes next makes the change.
	if recs := retiringOf(t, client, id); len(recs) != 1 || recs[0].Node != "node-a" {
		t.Errorf("retiring attachments on the PV after the fence: %+v; want node-a's", recs)
	}
	waitFor(t, "replica b's index to list the retiring attachment", func() bool { return len(b.index.Retiring()) == 1 })
	if stop {
		// Replica a stops (it never retries anything); replica b leads,
		// and its pass makes the change and removes the record.
		if _, err := b.fence.Reconcile(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	} else {
		// The fencer retries: nothing left to release; its settle makes
		// the change (every release ends with one) and removes the
		// record.
		if released, err := a.fenceNode(context.Background(), id, "node-a"); err != nil || released {
			t.Errorf("the fence's retry: released=%t, %v; want nothing released, the change made", released, err)
		}
	}
	if recs := retiringOf(t, client, id); len(recs) != 0 {
		t.Errorf("retiring attachments on the PV after the change: %+v; want none", recs)
	}

	a.rds.mu.Lock()
	matched := a.rds.landLocked(late)
	a.rds.mu.Unlock()
	if d := a.disk(id); matched && d.Exported && d.AllowHost == hostA {
		t.Errorf("node-a was fenced, then a late open conditioned on the tombstone its cut left landed: the export is open to the fenced attachment %s (its queued writes land) until the next reconcile", hostA)
	}
}

// A replica released node-a's claim after its cut and stopped before the
// change after the release; an open of node-a's attachment, conditioned
// on the state the cut left, is in flight. The attacher's retry, served
// by another replica, finds no claim but the record, changes the export
// before it answers, and removes the record: the late open then matches
// nothing.
func TestLateOpenCannotLandAfterARetriedUnpublish(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000001ae", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	hostA := a.hostOf(id, "node-a")
	a.dropAutoVA(id, nodeA)
	releaseAndStop(t, a, id)
	d := a.disk(id)
	t1 := rds.StateOf(&d)

	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	if recs := retiringOf(t, client, id); len(recs) != 0 {
		t.Errorf("records after the retried unpublish: %+v", recs)
	}
	if _, err := a.rds.SwapExport(context.Background(), id, t1, rds.ExportState{Open: true, Host: hostA}); err == nil {
		t.Error("the late open of node-a's retired attachment landed after the retried unpublish answered")
	}
	wantClosed(t, a, id)
}

// A release that reached one PV of two (the unpublish failed on the
// second, node-a out of service, so its cut closed the export to state
// T1), and an open of node-a's attachment conditioned on T1 in flight
// (decided before the release). The leader's pass completes the release
// on the second PV, changes the state once more and removes both records;
// the late open then matches nothing.
func TestLateOpenCannotLandAfterTheLeaderCompletesAHalfRelease(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
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

// A cut that lands late cannot close the export under the live holder.
// An open state recurs (a cut reopens the export to the same host), so a
// drop straight from an open state could match again; the drop of an
// export open to a live holder is made from a park instead, a fresh state
// nothing late can have read. The interleaving: the source node-a of a
// finished migration is force-detached (NotReady, so its host is cut);
// the first cut open(node-b) -> closed times out and the unpublish fails;
// its retry cuts and reopens to node-b and releases node-a; the first cut
// lands. Landed and matching, it would close the export under node-b (the
// running VM) until the leader's next reconcile (1 min by default, longer
// than fast_io_fail_tmo's 30 s, so the VM would see I/O errors).
func TestLateCutCannotCloseTheExportUnderTheLiveHolder(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000012", corev1.ReadWriteMany, true)
	_, hostB := a.migrateAToB(id)
	setReady(t, client, "node-a", corev1.ConditionUnknown, time.Now())

	var late *lateSwap
	a.rds.mu.Lock()
	a.rds.delaySwap = func(s *lateSwap) bool {
		if late == nil && !s.to.Open {
			late = s
			return true
		}
		return false
	}
	a.rds.mu.Unlock()
	if err := a.unpublish(id, nodeA); err == nil {
		t.Fatal("the unpublish answered with its cut timed out")
	}
	a.rds.mu.Lock()
	a.rds.delaySwap = nil
	a.rds.mu.Unlock()
	if late == nil {
		t.Fatal("no cut was sent")
	}
	if err := a.unpublish(id, nodeA); err != nil { // the attacher's retry
		t.Fatal(err)
	}
	a.waitClaims(id, "node-b")
	wantExport(t, a, id, true, hostB)

	a.rds.mu.Lock()
	a.rds.landLocked(late)
	a.rds.mu.Unlock()
	if d := a.disk(id); !d.Exported || d.AllowHost != hostB {
		t.Errorf("node-a's detach is done and node-b holds the volume alone; a cut of the first try landed late: exported=%t allow-host=%q, node-b (the running VM) is cut off until the next reconcile", d.Exported, d.AllowHost)
	}
}

// In a live migration a retirement that leaves another holder and does
// not cut (an unpublish from a Ready node) still leaves no way back in
// for the retired source: a repeated publish of the source leaves the
// export with the target (or is refused, ABORTED), so no open of the
// source is in flight to land after the source's unpublish. The
// interleaving: a repeated publish of the migration source that read
// open(target) and the source's claim sends open(target) -> open(source)
// and is held; the source's detach completes on the other replica; the
// held command lands. Landed and matching, it would open the export to a
// retired attachment (whose node knows its NQN from the first publish)
// and close it to the live target.
func TestLateSourceOpenCannotLandAfterItsUnpublishInAMigration(t *testing.T) {
	a, b, client := newTwoFencedReplicas(t, "node-a", "node-b")
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := a.newVolume(client, "pvc-2e000000-0000-4000-8000-000000000001", corev1.ReadWriteMany, true)
	b.waitIndexed(id)
	hostA, hostB := a.migrateAToB(id)
	b.waitClaims(id, "node-a", "node-b")

	// A repeated publish of the source (node-a) on replica a: its open
	// open(B) -> open(A) is in flight.
	slow := a.rds.holdNext("SwapExport")
	answered := make(chan error, 1)
	go func() {
		_, err := a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwx})
		answered <- err
	}()
	if !enteredBeforeAnswer(t, slow, answered, "the source's repeated publish") {
		// It sent no swap: the export stays with the target.
		if err := b.unpublish(id, nodeA); err != nil {
			t.Fatal(err)
		}
		wantExport(t, a, id, true, hostB)
		return
	}

	// The source's detach completes on replica b (node-a is Ready: no cut).
	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	if _, held := claimsOf(t, client, id)["node-a"]; held {
		t.Fatal("node-a's claim survived its unpublish")
	}
	wantExport(t, a, id, true, hostB)

	// The slow open lands now. Catch the export before the in-flight
	// publish's next round repairs it (a command that timed out on the
	// caller's side and lands later has no such next round: the export
	// then stays so until the leader's reconcile).
	next := a.rds.holdNext("SwapExport")
	close(slow.release)
	<-next.entered
	d := a.disk(id)
	close(next.release)
	<-answered
	if d.Exported && d.AllowHost == hostA {
		t.Errorf("after node-a's unpublish completed, its in-flight open landed: the export is open to the retired attachment %s (and closed to the live target %s)", hostA, hostB)
	}
}

// The same with a fence: once the fence of a migration source completed,
// no open of the source decided before it can land. CutOff drops and
// reopens the export to the remaining holder, the claim goes, and Settle
// finds the export open to the remaining holder. The interleaving: a
// repeated publish of the fenced node, held at its export read, reads the
// export after the CutOff and the claims before the release, and sends
// open(B) -> open(A), held; the fence completes; the held command lands.
// Landed, it would let the fenced host in again, and its queued writes
// land.
func TestLateOpenCannotLetAFencedMigrationSourceBackIn(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := a.newVolume(client, "pvc-2e000000-0000-4000-8000-000000000002", corev1.ReadWriteMany, true)
	hostA, hostB := a.migrateAToB(id)

	// A repeated publish of node-a, held at its export read.
	pubRead := a.rds.holdNext("GetDisk")
	answered := make(chan error, 1)
	go func() {
		_, err := a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwx})
		answered <- err
	}()
	<-pubRead.entered

	// node-a goes out of service; the fence runs (as the leader's fencer
	// would) and is held at the read that follows its reopen to node-b.
	taintNode(t, client, "node-a", fencing.OutOfServiceTaint, "nodeshutdown")
	g1 := a.rds.holdNext("GetDisk")
	fenced := make(chan error, 1)
	go func() {
		released, err := a.fenceNode(context.Background(), id, "node-a")
		if err == nil && !released {
			err = errors.New("fence released nothing")
		}
		fenced <- err
	}()
	// Its rounds: park (the drop of an export open to a live holder is
	// made from a park), drop, reopen, then the read that finds it done.
	<-g1.entered
	g2 := a.rds.holdNext("GetDisk")
	close(g1.release)
	<-g2.entered
	g2b := a.rds.holdNext("GetDisk")
	close(g2.release)
	<-g2b.entered
	g3 := a.rds.holdNext("GetDisk")
	close(g2b.release)
	<-g3.entered
	wantExport(t, a, id, true, hostB) // dropped and reopened to node-b
	if a.drops(id) != 1 {
		t.Fatalf("%d drops by the cut, want 1", a.drops(id))
	}

	// The publish reads the export (open to B) and the claims (node-a's
	// not released yet) and sends open(B) -> open(A).
	slow := a.rds.holdNext("SwapExport")
	close(pubRead.release)
	if !enteredBeforeAnswer(t, slow, answered, "the fenced node's repeated publish") {
		// It sent no swap; the fence completes, and the export stays
		// with node-b.
		close(g3.release)
		if err := <-fenced; err != nil {
			t.Fatal(err)
		}
		wantExport(t, a, id, true, hostB)
		return
	}

	// The fence completes: release, then Settle.
	close(g3.release)
	if err := <-fenced; err != nil {
		t.Fatal(err)
	}
	if _, held := claimsOf(t, client, id)["node-a"]; held {
		t.Fatal("node-a's claim survived its fence")
	}

	next := a.rds.holdNext("SwapExport")
	close(slow.release)
	<-next.entered
	d := a.disk(id)
	close(next.release)
	<-answered
	if d.Exported && d.AllowHost == hostA {
		t.Errorf("after node-a's fence completed, the export was open to its attachment %s again: the fenced host's queued writes can land", hostA)
	}
}
