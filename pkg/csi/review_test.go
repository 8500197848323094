package csi

// Outside review of "Storage fencing: the export follows the claims"
// (d37e1ef, 16d2e25). Each test here failed on the code under review and passes since its
// fix; the comment on each says the hole it showed. The three live-migration
// holes it found are still open: review_migration_test.go (build tag
// review21).

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// newReviewReplicas: two fenced replicas on one API server and one RDS,
// without the informer-driven fencer (a test runs a fence itself, at the
// moment it chooses).
func newReviewReplicas(t *testing.T, nodes ...*corev1.Node) (*publishEnv, *publishEnv, *fake.Clientset) {
	t.Helper()
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, n)
	}
	client := newFakeAPI(objs...)
	shared := newFakeRDS(1 << 40)
	// Each replica calls the API server through a client of its own, so
	// that a test can hold or fail one replica's requests alone.
	a := newPublishEnvWith(t, newLaggingClient(t, client).Clientset, shared, fencing.DefaultConfig(), allowHostOptions(), withoutNodeFencer)
	b := newPublishEnvWith(t, newLaggingClient(t, client).Clientset, shared, fencing.DefaultConfig(), allowHostOptions(), withoutNodeFencer)
	for _, e := range []*publishEnv{a, b} {
		e.own, e.client = e.client, client
	}
	return a, b, client
}

func nodeWithUID(name, uid string) *corev1.Node {
	n := testNode(name)
	n.UID = types.UID(uid)
	return n
}

// Hole (target 3, and 2 through the reconcile): a paused replica's
// publish read the VolumeAttachment live, then the attachment was
// detached and its unpublish found no claim; the commit lands (the PV did
// not change), and the re-read after the commit FAILS (API timeout):
// confirmCommitted returns that error without withdrawing the claim it
// created. The VolumeAttachment is gone, so nothing retries or releases:
// an orphaned claim, and the leader's reconcile then OPENS the export to
// it.
func TestReviewOrphanedClaimWhenPostCommitReadFails(t *testing.T) {
	a, b, client := newTwoFencedReplicas(t, "node-a")
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2e000000-0000-4000-8000-000000000004", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	a.ensureVA(id, nodeA)
	name := claims.VolumeAttachmentName(id, DefaultDriverName, "node-a")
	va, err := client.StorageV1().VolumeAttachments().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The detach: the VolumeAttachment goes and its unpublish (replica b)
	// finds no claim.
	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the VolumeAttachment gone", func() bool {
		_, err := client.StorageV1().VolumeAttachments().Get(context.Background(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	// Replica a's publish: its first read (made before the detach) saw
	// the VolumeAttachment live; its re-read after the commit times out.
	gets := 0
	client.PrependReactor("get", "volumeattachments", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets++
		switch gets {
		case 1:
			return true, va.DeepCopy(), nil
		case 2:
			return true, nil, apierrors.NewTimeoutError("the API server is slow", 1)
		}
		return false, nil, nil
	})
	_, err = a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
	if err == nil {
		t.Fatal("publish answered success")
	}
	if c := claimsOf(t, client, id); len(c) != 0 {
		t.Errorf("publish failed (%v) but left claims %v with no VolumeAttachment: orphaned", err, keys(c))
		a.waitClaims(id, "node-a")
		if _, err := a.fence.Reconcile(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		if d := a.disk(id); d.Exported {
			t.Errorf("and the leader's reconcile opened the export to it (%s)", d.AllowHost)
		}
	}
}

// Hole (targets 5, 6): a claim written before claims recorded node UIDs
// (a bare time; HolderStale, diagnose and the informers treat an empty
// UID as "same node") is taken by publish for another incarnation: a
// repeated publish of that attachment makes a NEW nonce, answers a
// hostNQN in publish_context where the first answer had none, and moves
// the export to it, off the host the node is connected with.
func TestReviewPreUIDClaimRepublishGetsANewHostNQN(t *testing.T) {
	a, _, client := newReviewReplicas(t, nodeWithUID("node-a", "uid-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2e000000-0000-4000-8000-000000000005", corev1.ReadWriteOnce, false)
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Annotations = map[string]string{claims.ClaimsAnnotation: `{"node-a":"2026-11-01T00:00:00Z"}`}
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := a.disk(id)
	d.Exported = true // attached before storage fencing: open to any host
	a.rds.putDisk(d)
	a.waitClaims(id, "node-a")
	resp, err := a.publish(id, nodeA, rwo) // the same attachment, published again
	if err != nil {
		t.Fatal(err)
	}
	// Since node IDs no longer carry the node's own NQN, such an
	// attachment (made before storage fencing, its export open to any
	// host) cannot be narrowed to the NQN it is connected with: it gets
	// its own attachment NQN, and the export never stays open to any
	// host. An export that was open to any host may have let anyone in,
	// so it is dropped once as it is narrowed (the node reconnects as
	// its attachment on its next stage).
	host := resp.PublishContext[PublishContextHostNQN]
	if c := claimsOf(t, client, id)["node-a"]; c.Nonce == "" || host == "" {
		t.Errorf("claim %+v, publish_context host %q: want an attachment NQN of its own", c, host)
	}
	if d := a.disk(id); !d.Exported || d.AllowHost != host {
		t.Errorf("the export allows %q (exported=%t), want %s", d.AllowHost, d.Exported, host)
	}
	if n := a.drops(id); n != 1 {
		t.Errorf("%d drops, want 1: whoever connected while it was open to any host is cut off", n)
	}
}

// Hole (target 6): the doc says an attachment without a nonce "keeps the
// node's own NQN, recorded in the claim, until it ends: a repeated
// publish keeps it". The code overwrites the recorded NQN with the one in
// the repeated request's node ID, and moves the export to it.
func TestReviewLegacyClaimRepublishKeepsRecordedNQN(t *testing.T) {
	a, _, client := newReviewReplicas(t, nodeWithUID("node-a", "uid-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2e000000-0000-4000-8000-000000000006", corev1.ReadWriteOnce, false)
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Annotations = map[string]string{claims.ClaimsAnnotation: `{"node-a":{"at":"2026-11-01T00:00:00Z","uid":"uid-a","cap":"mount/SINGLE_NODE_WRITER","gen":1,"nqn":"` + nqnA + `"}}`}
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := a.disk(id)
	d.Exported, d.AllowHost = true, nqnA
	a.rds.putDisk(d)
	a.waitClaims(id, "node-a")
	// The node plugin re-registered with another host NQN (e.g. a new
	// /etc/nvme/hostnqn); the kernel connection of the live attachment is
	// still nqnA's.
	if _, err := a.publish(id, "node-a/"+nqnB, rwo); err != nil {
		t.Fatal(err)
	}
	if c := claimsOf(t, client, id)["node-a"]; c.HostNQN != nqnA {
		t.Errorf("the claim's recorded NQN changed to %q", c.HostNQN)
	}
	wantExport(t, a, id, true, nqnA)
}
