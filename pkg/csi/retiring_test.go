package csi

import (
	"context"
	"fmt"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// failSwapAfter makes the n-th SwapExport from now on fail as a command
// whose outcome is unknown (it never lands).
func failSwapAfter(f *fakeRDS, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := 0
	f.atCall = func(method string) {
		if method != "SwapExport" {
			return
		}
		if seen++; seen == n {
			f.fail[method] = fmt.Errorf("exporting disk: %w: command timed out after it was sent", rds.ErrOutcomeUnknown)
		}
	}
}

// fenceWithFailedSettle fences node (out of service) on replica e with
// the second export change (the one after the release) failing: its
// claim is released, the record of the release stays on the PV.
func fenceWithFailedSettle(t *testing.T, e *publishEnv, id, node string) {
	t.Helper()
	failSwapAfter(e.rds, 2) // 1: the cut before the release; 2: the change after it
	released, err := e.fenceNode(context.Background(), id, node)
	e.rds.mu.Lock()
	e.rds.atCall = nil
	e.rds.mu.Unlock()
	if !released || err == nil {
		t.Fatalf("the fence: released=%t, %v; want the claim released and the change after it failed", released, err)
	}
}

// A fence whose change after the release failed leaves the change to the
// leader. When the fenced node recovers and is published again before
// the leader makes it, the new attachment (a new nonce, the same node
// incarnation) stands: the leader's change treats only the released
// attachment as gone. Before the record named the attachment, the retry
// of a failed Settle excluded every claim of the node's incarnation, so it
// closed the export under the node's new attachment: a false fence of a
// healthy node.
func TestLeaderRetirementLeavesTheNodesNewAttachmentAlone(t *testing.T) {
	a, b, client := newReviewReplicas(t, testNode("node-a"))
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

// An unpublish records the attachment it releases and, once the export
// change after the release is made, removes the record itself: the
// leader has nothing left to do.
func TestUnpublishRemovesItsRetiringRecord(t *testing.T) {
	a, _, client := newReviewReplicas(t, testNode("node-a"))
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
