// Outside review of issue 21's export-follows-claims change: the holes it
// found in live migrations (two holders, one allowed host). Each failed on
// the code under review; since the fix a repeated publish of the older
// holder (the source) leaves a migration's export with the target, so no
// late open of the source can land after its retirement, and since model
// finding 2 it is refused (ABORTED) rather than told it may write.

package csi

// x of "Storage fencing: the export follows the claims"
// (d37e1ef, 16d2e25). Each test here FAILS on the code under review; see
// the comment on each for the hole it shows.

import (
	"context"
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// Hole (target 2, also 1): a retirement that leaves another holder and
// does not cut (an unpublish from a Ready node during a live migration)
// changes the export state NOT AT ALL, contrary to "a retirement always
// changes the state". A repeated publish of the migration source that
// read open(target) and the source's claim swaps open(target) ->
// open(source); it lands after the source's unpublish completed and
// matches: the export is open to a retired attachment (whose node knows
// its NQN from the first publish) and closed to the live target.
func TestReviewLateSourceOpenLandsAfterReadyUnpublishInMigration(t *testing.T) {
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

// Hole (target 2): the same with a fence. CutOff drops and reopens the
// export to the remaining holder, the claim goes, and Settle, finding
// the export open to the remaining holder, changes nothing (cut is never
// set for Settle). A repeated publish of the fenced node that read the
// export after the CutOff and the claims before the release lands after
// the fence completed: the fenced host is let in again, its queued
// writes land.
func TestReviewFencedHostLetInAfterFenceCompletedInMigration(t *testing.T) {
	a, _, client := newReviewReplicas(t, testNode("node-a"), testNode("node-b"))
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

// Hole (target 1): during a migration, a repeated publish of the source
// moves the export back to the source (prefer = requester). The target,
// already told success and not necessarily connected yet (NodeStage comes
// after publish), is refused by the RDS. The comment on
// TestReconcileLeavesAMigrationAlone says a repeated source publish does
// not take the export off the target; nothing tests it.
func TestReviewRepeatedSourcePublishTakesExportOffTarget(t *testing.T) {
	a, _, client := newTwoFencedReplicas(t, "node-a", "node-b")
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := a.newVolume(client, "pvc-2e000000-0000-4000-8000-000000000003", corev1.ReadWriteMany, true)
	if _, err := a.publish(id, nodeA, rwx); err != nil {
		t.Fatal(err)
	}
	a.waitClaims(id, "node-a")
	resp, err := a.publish(id, nodeB, rwx)
	if err != nil {
		t.Fatal(err)
	}
	a.waitClaims(id, "node-a", "node-b")
	target := resp.PublishContext[PublishContextHostNQN]
	wantExport(t, a, id, true, target)
	// The attacher repeats the source's publish: refused (ABORTED) while
	// the export allows the target, or answered with the export left so.
	if _, err := a.publish(id, nodeA, rwx); err != nil && status.Code(err) != codes.Aborted {
		t.Fatal(err)
	}
	if d := a.disk(id); !d.Exported || d.AllowHost != target {
		t.Errorf("node-b was told it may write with host %s; after a repeated publish of the source the export allows %q (exported=%t): node-b's NodeStage is refused", target, d.AllowHost, d.Exported)
	}
}

// enteredBeforeAnswer waits until the held call h arrives or the call
// answered on answered does first (then h is disarmed, and the answer's
// error fails the test). It reports whether h arrived.
func enteredBeforeAnswer(t *testing.T, h *hold, answered chan error, what string) bool {
	t.Helper()
	select {
	case <-h.entered:
		return true
	case err := <-answered:
		close(h.release) // disarmed: a later call passes through
		if err != nil && status.Code(err) != codes.Aborted {
			// ABORTED: the older holder of a migration is refused while
			// the export allows the newer.
			t.Fatalf("%s: %v", what, err)
		}
		return false
	}
}
