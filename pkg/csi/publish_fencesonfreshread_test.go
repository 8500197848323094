package csi

import (
	"context"
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// A publish that fences a holder stands on a live read of that holder,
// and a commit that conflicts decides again on what changed: it must not
// fence on the read it made before the conflict. The conflict may be the
// holder itself publishing again (its node recovered: the out-of-service
// taint lifted), answered OK on another replica. The publish's retry
// reuses the node state it read live in its first attempt
// (publishing.live), fences the holder again, and its cut and commit take
// the volume from a healthy node that was just told it may write: its
// export is closed under it and its claim released (a false fence).
//
// Separately, the first attempt's cut landed after the holder's repeated
// publish and closed the export under it; when that commit conflicts,
// nothing settles the export (the node fencer's Release always settles
// after a cut; Commit's cut does not): were the retry refused, the holder
// would stay shut out until the leader's reconcile.
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
	a, b, client := newReviewReplicas(t, testNode(nodeA), testNode(nodeB))
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
	a, _, client := newReviewReplicas(t, testNode(nodeA), testNode(nodeB))
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
