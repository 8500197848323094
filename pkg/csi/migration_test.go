package csi

import (
	"context"
	"fmt"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// Live migrations: two holders of one ReadWriteMany block volume and one
// allowed host. The export moves from the source to the target (and back
// when the migration is aborted) through a park, a fresh state that keeps
// every connection: neither holder is dropped while the VM moves.

// During a migration a repeated publish of the source does not move the
// export back to the source (prefer = requester): the target, already
// told success and not necessarily connected yet (NodeStage comes after
// publish), would be refused by the RDS. TestReconcileLeavesAMigrationAlone
// relies on this.
func TestMigrationRepeatedSourcePublishLeavesTheExportWithTheTarget(t *testing.T) {
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

// A repeated publish of a migration's source is refused only while the
// export allows the target, not whenever the target has a claim: with the
// target's claim committed and its move not made (its publish failed on
// the RDS, to be retried), the export still allows the source, and the
// source's repeated publish is answered with its own host, not ABORTED
// "its export allows the newer holder".
func TestMigrationSourceAnsweredWhileTheExportAllowsIt(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000008", corev1.ReadWriteMany, true)
	if _, err := a.publish(id, nodeA, rwx); err != nil {
		t.Fatal(err)
	}
	a.waitClaims(id, "node-a")
	hostA := a.hostOf(id, "node-a")
	// node-b joins; its first export change (the park) fails, nothing
	// landed: the claim stays (its VolumeAttachment stands, the attacher
	// retries), the export still allows node-a.
	a.ensureVA(id, nodeB)
	a.rds.failNext("SwapExport", fmt.Errorf("exporting disk: %w: connection refused", rds.ErrTransient))
	if _, err := a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeB, VolumeCapability: rwx}); err == nil {
		t.Fatal("node-b's publish answered success with its export change failed")
	}
	a.waitClaims(id, "node-a", "node-b")
	wantExport(t, a, id, true, hostA)
	resp, err := a.publish(id, nodeA, rwx)
	if err != nil {
		t.Errorf("a repeated publish of node-a while the export allows node-a's attachment: %v", err)
	} else if resp.PublishContext[PublishContextHostNQN] != hostA {
		t.Errorf("answered host %q, want %s", resp.PublishContext[PublishContextHostNQN], hostA)
	}
	wantExport(t, a, id, true, hostA)
}

// An aborted live migration (KubeVirt deletes the target pod; the
// target's node is Ready and unstaged, so its detach is graceful,
// cut=false) hands the export back to the source without dropping the
// source's connection: the source VM is the one running. The export open
// to the departing target's attachment is "open to a host no live claim
// has"; closed and reopened, it would drop the source's kernel, whose I/O
// then stalls until it reconnects (reconnect_delay), failing to the VM if
// that takes longer than fast_io_fail_tmo. It moves through a park on the
// way from the departing target (a fresh state, so no late command can
// act on it).
func TestMigrationAbortHandsTheExportBackWithoutADrop(t *testing.T) {
	a, _, client := newTwoFencedReplicas(t, "node-a", "node-b")
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000001", corev1.ReadWriteMany, true)
	hostA, _ := a.migrateAToB(id)
	before := a.drops(id)
	// The migration is aborted: the target's VolumeAttachment goes, its
	// node Ready (it unstaged before the detach).
	if err := a.unpublish(id, nodeB); err != nil {
		t.Fatal(err)
	}
	a.waitClaims(id, "node-a")
	wantExport(t, a, id, true, hostA)
	if n := a.drops(id) - before; n != 0 {
		t.Errorf("an aborted migration (the target detached gracefully from a Ready node) dropped every connection %d time(s): the running source's connection went with them", n)
	}
}

// A replica that dies between the park and the open leaves the export
// parked; the leader's reconcile finishes the move to the target without
// a drop, and an aborted migration (the target's detach) moves a parked
// export back to the source without a drop.
func TestMigrationStrandedParkIsFinishedWithoutADrop(t *testing.T) {
	for _, abort := range []bool{false, true} {
		a, _, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
		rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
		id := a.newVolume(client, fmt.Sprintf("pvc-2f000000-0000-4000-8000-00000000001%d", map[bool]int{false: 0, true: 1}[abort]), corev1.ReadWriteMany, true)
		if _, err := a.publish(id, nodeA, rwx); err != nil {
			t.Fatal(err)
		}
		hostA := a.hostOf(id, "node-a")
		drops := a.drops(id)
		// node-b's publish parks the export; its open is lost (the
		// replica died: the command never reaches the RDS).
		a.ensureVA(id, nodeB)
		park := a.rds.holdNext("SwapExport")
		answered := make(chan error, 1)
		go func() {
			_, err := a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeB, VolumeCapability: rwx})
			answered <- err
		}()
		<-park.entered
		open := a.rds.holdNext("SwapExport")
		close(park.release)
		<-open.entered
		a.rds.failNext("SwapExport", fmt.Errorf("exporting disk: %w: connection refused", rds.ErrTransient))
		close(open.release)
		if err := <-answered; err == nil {
			t.Fatal("node-b answered with its open failed")
		}
		a.waitClaims(id, "node-a", "node-b")
		if d := a.disk(id); !a.fence.ParkedFrom(id, d.AllowHost, hostA) {
			t.Fatalf("export %+v; want parked from node-a", d)
		}
		if abort {
			if err := a.unpublish(id, nodeB); err != nil {
				t.Fatal(err)
			}
			wantExport(t, a, id, true, hostA)
		} else {
			if _, err := a.fence.Reconcile(context.Background(), nil); err != nil {
				t.Fatal(err)
			}
			wantExport(t, a, id, true, a.hostOf(id, "node-b"))
		}
		if a.drops(id) != drops {
			t.Errorf("abort=%t: %d drops finishing a stranded park, want 0", abort, a.drops(id)-drops)
		}
	}
}

// A reconcile pass that runs while a migration's target is being let in
// (the export parked on its way from the source, the target's open not
// landed yet: a slow RDS command, up to its timeout) finds the park and
// completes the move without reporting it as an export/claim mismatch: a
// Warning event on the PV, the counter, and RDSCSIExportClaimMismatch
// firing (increase > 0, for 0m) would be a false alert on a benign race.
// A park from a live holder is a move under way, not a mismatch; so is an
// export still closed behind a claim committed a moment ago.
func TestReconcileDoesNotReportAMigrationMoveUnderWay(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000006", corev1.ReadWriteMany, true)
	if _, err := a.publish(id, nodeA, rwx); err != nil {
		t.Fatal(err)
	}
	hostA := a.hostOf(id, "node-a")
	a.ensureVA(id, nodeB)
	park := a.rds.holdNext("SwapExport")
	answered := make(chan error, 1)
	go func() {
		_, err := a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeB, VolumeCapability: rwx})
		answered <- err
	}()
	<-park.entered
	open := a.rds.holdNext("SwapExport")
	close(park.release)
	<-open.entered
	if d := a.disk(id); !d.Exported || !a.fence.ParkedFrom(id, d.AllowHost, hostA) {
		t.Fatalf("export %+v; want parked on the way from node-a", d)
	}
	a.waitClaims(id, "node-a", "node-b")

	// The leader's periodic pass runs now (on a replica whose publish is
	// held: the other replica's pass is the same).
	var reported []storagefence.Mismatch
	if _, err := a.fence.Reconcile(context.Background(), func(m storagefence.Mismatch) { reported = append(reported, m) }); err != nil {
		t.Fatal(err)
	}
	close(open.release)
	if err := <-answered; err != nil && status.Code(err) != codes.Aborted {
		t.Fatal(err)
	}
	for _, m := range reported {
		t.Errorf("a move under way reported as an export/claim mismatch (event, counter, alert): found %s, now %s", m.Found, m.Now)
	}
}
