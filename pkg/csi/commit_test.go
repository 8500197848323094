package csi

import (
	"context"
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// A repeated publish of a live attachment whose commit fails part-way
// leaves that attachment standing: what a failed commit takes back is a
// claim it made for a NEW attachment (its own nonce, answered to no one).
// The same attachment written to a PV that did not show it yet (a PV made
// for the handle while the volume is attached) is not new: taking it back
// there writes a release record (rds.csi.srvlab.io/retiring) naming the
// live attachment, and from then on every PV's claim of it counts as
// retired. The next decision replaces it (a cut that drops the staged
// node's connection, and a new host NQN the node is not staged with), the
// export closes under it, and the leader's RetireMarked would complete
// "the release" on the other PV.
//
// Interleaving (ReadWriteOnce, one replica):
//  1. node-a publishes (PV p1): claim n1, export open to H(n1).
//  2. p0 is created for the handle (it sorts before p1: the commit
//     writes it first); it has no claims.
//  3. The same VolumeAttachment is published again: the live claim n1 is
//     looked up (on p1 only) and written to p0 (a claim p0 did not have),
//     then to p1, whose write conflicts (another writer changed p1 since
//     the decision: a label, the PV controller's status update, another
//     replica).
//  4. The take-back withdraws n1 from p0, with a record of n1.
func TestFailedRepeatedCommitKeepsTheLiveAttachment(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const name = "pvc-35a00000-0000-4000-8000-000000000001"
	id := a.newVolume(client, name, corev1.ReadWriteOnce, false)
	resp, err := a.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	h1 := resp.PublishContext[PublishContextHostNQN]
	n1 := claimsOf(t, client, name)[nodeA].Nonce
	wantExport(t, a, id, true, h1)
	drops := a.drops(id)

	ctx := context.Background()
	const p0 = "pv-0-" + name // sorts before name
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, testPV(p0, id, corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replica to know both PVs", func() bool { return indexedPVs(a.index.Volume(id)) == 2 })
	if first := a.index.Volume(id).PVs[0].Name; first != p0 {
		t.Fatalf("scripting: the commit should write %s first, the index lists %s first", p0, first)
	}

	held := holdAPI(a.own, "patch", "persistentvolumes", name)
	answered := make(chan error, 1)
	go func() {
		_, err := a.cs.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
		answered <- err
	}()
	<-held.entered
	if !has(claimsOf(t, client, p0), nodeA) {
		t.Fatalf("scripting: the repeated publish should have written node-a's claim to %s first", p0)
	}
	// Another writer changes p1 while the commit's write to it is on its way.
	if _, err := client.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	close(held.release)
	err = <-answered
	t.Logf("the repeated publish answered: %v", err)

	for _, pv := range []string{p0, name} {
		for _, r := range retiringOf(t, client, pv) {
			if r.Is(nodeA, claims.Claim{Nonce: n1}) {
				t.Errorf("PV %s records node-a's live attachment (nonce %s, host %s) as released: the failed commit's take-back retired the answered attachment", pv, n1, h1)
			}
		}
	}
	if c, ok := claimsOf(t, client, name)[nodeA]; !ok || c.Nonce != n1 {
		t.Errorf("node-a's live attachment n1 lost its claim on %s (now %+v, held %t)", name, c, ok)
	}
	if d := a.disk(id); !d.Exported || d.AllowHost != h1 {
		t.Errorf("the export no longer lets node-a's staged attachment in: exported=%t allow-host=%s, want %s", d.Exported, d.AllowHost, h1)
	}
	if n := a.drops(id) - drops; n != 0 {
		t.Errorf("node-a's live connection was dropped %d time(s)", n)
	}
}

// A publish that fences a holder stands on a live read of that holder,
// and a commit that conflicts decides again on what changed: it never
// fences on the read it made before the conflict. The conflict may be the
// holder itself publishing again (its node recovered: the out-of-service
// taint lifted), answered OK on another replica. The retry drops every
// live node read but the requester's, so it reads the holder again and
// finds it healthy; fencing it on the stale read would close the export
// under a node just told it may write and release its claim (a false
// fence).
//
// Separately, the first attempt's cut landed after the holder's repeated
// publish and closed the export under it; when that commit conflicts, the
// export is settled on the live claims, as after every cut, so even a
// refused retry would not leave the holder shut out until the leader's
// reconcile.
//
// Interleaving (ReadWriteOnce, replicas a and b, no node fencer):
//  1. node-a publishes: n1, export open to H(n1).
//  2. node-a is tainted out of service; node-b's publish on a decides
//     (node-a fenced, read live) and is held at its stand.
//  3. The taint is lifted; node-a's repeated publish, on b, is answered
//     OK (n1, gen 2).
//  4. node-b's publish goes on: its cut closes the export, its commit
//     conflicts, it decides again.
func TestPublishFencesNoHolderThatPublishedAgainMeanwhile(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode(nodeA), testNode(nodeB))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-35f00000-0000-4000-8000-000000000001", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	resp, err := a.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	hA := resp.PublishContext[PublishContextHostNQN]
	a.waitClaims(id, nodeA)
	b.waitClaims(id, nodeA)

	taintNode(t, client, nodeA, fencing.OutOfServiceTaint, "nodeshutdown")
	waitFor(t, "replica a to see node-a out of service", func() bool { return a.index.Node(nodeA).OutOfService })
	vaB := testVA(id, nodeB, publishNow) // as the attacher makes it: not attached yet
	vaB.Status.Attached = false
	if _, err := putVA(context.Background(), client, vaB); err != nil {
		t.Fatal(err)
	}
	held := holdAPI(a.own, "get", "volumeattachments", claims.VolumeAttachmentName(id, DefaultDriverName, nodeB))
	answered := make(chan error, 1)
	go func() {
		_, err := a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeB, VolumeCapability: rwo})
		answered <- err
	}()
	<-held.entered

	untaintNode(t, client, nodeA)
	waitFor(t, "both replicas to see node-a in service", func() bool {
		return !a.index.Node(nodeA).OutOfService && !b.index.Node(nodeA).OutOfService
	})
	resp, err = b.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatalf("node-a's repeated publish once it recovered: %v", err)
	}
	if h := resp.PublishContext[PublishContextHostNQN]; h != hA {
		t.Fatalf("scripting: node-a's repeated publish answered %s, want %s", h, hA)
	}

	close(held.release)
	err = <-answered
	t.Logf("node-b's publish: %v", err)
	if _, ok := claimsOf(t, client, id)[nodeA]; !ok {
		t.Errorf("node-a's claim was released by node-b's publish (answered: %v) although node-a recovered and was answered OK before that publish's commit: fenced on a live read made before its conflict", err)
	}
	if d := a.disk(id); !d.Exported || d.AllowHost != hA {
		t.Errorf("node-a, answered OK, is shut out: export exported=%t allow-host=%s, want %s", d.Exported, d.AllowHost, hA)
	}
}

// A publish's cut of a holder it fences is followed by a settle on the
// live claims when its commit then fails, as every cut is (issue 35, gap
// 2: the node fencer's Release always settles). Otherwise the holder
// whose claim the failed commit left in place stays shut out: once its
// node recovers, the retried publish is refused and nothing reopens the
// export until the leader's reconcile, up to a minute.
//
// Interleaving (ReadWriteOnce, one replica, no node fencer):
//  1. node-a publishes: n1, export open to H(n1).
//  2. node-a is tainted out of service; node-b's publish fences it: the
//     cut closes the export, the commit's write fails (an API error): the
//     publish answers UNAVAILABLE, node-a's claim stays.
//  3. The taint is lifted.
func TestPublishWhoseCommitFailsAfterItsCutLetsTheHolderBackIn(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, testNode(nodeA), testNode(nodeB))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const name = "pvc-35f00000-0000-4000-8000-000000000002"
	id := a.newVolume(client, name, corev1.ReadWriteOnce, false)
	resp, err := a.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	hA := resp.PublishContext[PublishContextHostNQN]
	a.waitClaims(id, nodeA)

	taintNode(t, client, nodeA, fencing.OutOfServiceTaint, "nodeshutdown")
	waitFor(t, "the replica to see node-a out of service", func() bool { return a.index.Node(nodeA).OutOfService })
	failAPIOnce(a.own, "patch", "persistentvolumes", name, apierrors.NewInternalError(errors.New("etcd timed out")))
	if _, err := a.publish(id, nodeB, rwo); code(err) != codes.Unavailable {
		t.Fatalf("scripting: node-b's publish whose commit fails: %v, want UNAVAILABLE", err)
	}
	if _, ok := claimsOf(t, client, id)[nodeA]; !ok {
		t.Fatal("scripting: the failed commit should leave node-a's claim")
	}
	untaintNode(t, client, nodeA)
	waitFor(t, "the replica to see node-a in service", func() bool { return !a.index.Node(nodeA).OutOfService })
	if d := a.disk(id); !d.Exported || d.AllowHost != hA {
		t.Errorf("node-a holds the claim and is in service again, but its export is exported=%t allow-host=%s (want %s): the publish's cut was not followed by a settle when its commit failed", d.Exported, d.AllowHost, hA)
	}
}
