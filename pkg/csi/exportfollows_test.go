package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// The export follows the claims: it is opened to an attachment only for a
// claim committed on a live VolumeAttachment, a publish that is not
// answered leaves neither, and the leader's reconcile re-derives the
// export from the live claims. Commands that land late:
// latecommand_test.go.

var vaGVR = schema.GroupVersionResource{Group: "storage.k8s.io", Version: "v1", Resource: "volumeattachments"}

// A paused replica's publish whose VolumeAttachment is gone (its attacher
// lost its lease, the other detached it): nothing is recorded, nothing
// opened.
func TestPublishWithoutLiveVolumeAttachmentLeavesNoClaim(t *testing.T) {
	a, _, client := newTwoFencedReplicas(t, "node-a")
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-21000000-0000-4000-8000-000000000003", corev1.ReadWriteOnce, false)
	_, err := a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
	mustCode(t, "publish without a VolumeAttachment", err, codes.Aborted)
	if c := claimsOf(t, client, id); len(c) != 0 {
		t.Fatalf("claims %v left by a publish without a VolumeAttachment", c)
	}
	wantClosed(t, a, id)

	// A VolumeAttachment being deleted does not count either.
	va := testVA(id, "node-a", testClock)
	va.Finalizers = []string{"external-attacher/rds-csi-srvlab-io"}
	if _, err := client.StorageV1().VolumeAttachments().Create(context.Background(), va, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.StorageV1().VolumeAttachments().Delete(context.Background(), va.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
	mustCode(t, "publish on a deleting VolumeAttachment", err, codes.Aborted)
	if c := claimsOf(t, client, id); len(c) != 0 {
		t.Fatalf("claims %v left by a publish on a deleting VolumeAttachment", c)
	}
}

// The VolumeAttachment is detached between the claim's commit and the
// answer: the claim this call made is taken back.
func TestPublishWithdrawsItsClaimWhenTheAttachmentGoesMeanwhile(t *testing.T) {
	a, _, client := newTwoFencedReplicas(t, "node-a")
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-21000000-0000-4000-8000-000000000004", corev1.ReadWriteOnce, false)
	a.ensureVA(id, nodeA)
	name := claims.VolumeAttachmentName(id, DefaultDriverName, "node-a")
	committed := false
	client.PrependReactor("patch", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
		committed = true
		return false, nil, nil
	})
	client.PrependReactor("get", "volumeattachments", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if committed { // the re-read after the commit
			_ = client.Tracker().Delete(vaGVR, "", name)
		}
		return false, nil, nil
	})
	_, err := a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
	mustCode(t, "publish whose VolumeAttachment went after the commit", err, codes.Aborted)
	if c := claimsOf(t, client, id); len(c) != 0 {
		t.Fatalf("claims %v left after the VolumeAttachment went", c)
	}
	wantClosed(t, a, id)
}

// A repeated publish of a live-migration source does not take the export
// off the target; the reconcile leaves a migration's export alone.
func TestReconcileLeavesAMigrationAlone(t *testing.T) {
	a, _, client := newTwoFencedReplicas(t, "node-a", "node-b")
	id := a.newVolume(client, "pvc-21000000-0000-4000-8000-000000000005", corev1.ReadWriteMany, true)
	_, target := a.migrateAToB(id)
	if n, err := a.fence.Reconcile(context.Background(), nil); err != nil || n != 0 {
		t.Fatalf("reconcile of a migration = %d, %v; want nothing to fix", n, err)
	}
	wantExport(t, a, id, true, target)
	if n := a.drops(id); n != 0 {
		t.Fatalf("%d drops during a migration", n)
	}
}

// The reconcile decides on the live claims, not on a lagging index: an
// export open to a claim the index has not seen yet is not closed.
func TestReconcileOnLiveClaimsNotALaggingIndex(t *testing.T) {
	a, b, client := newTwoFencedReplicas(t, "node-a")
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-21000000-0000-4000-8000-000000000006", corev1.ReadWriteOnce, false)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	host := a.hostOf(id, "node-a")
	// b's index has not necessarily seen the claim; whatever it shows,
	// its reconcile must leave node-a's export open.
	if _, err := b.fence.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	wantExport(t, a, id, true, host)
	// And a reconcile whose leadership is gone changes nothing.
	d := a.disk(id)
	d.Exported, d.AllowHost = true, nqnB // an export no claim calls for
	a.rds.putDisk(d)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.fence.Reconcile(ctx, nil); err == nil {
		t.Fatal("a reconcile with its leadership lost reported no error")
	}
	wantExport(t, a, id, true, nqnB)
	var found []storagefence.Mismatch
	if n, err := a.fence.Reconcile(context.Background(), func(m storagefence.Mismatch) { found = append(found, m) }); err != nil || n != 1 || len(found) != 1 {
		t.Fatalf("reconcile = %d, %v, %v; want the mismatch fixed and reported", n, err, found)
	}
	wantExport(t, a, id, true, host)
}

// A ReadOnlyMany volume read by several nodes: its export is open to any
// host while only readers hold it (one allowed host would shut every reader
// but one out), and closed when the last reader leaves.
func TestStorageFencingReadOnlyManyReaders(t *testing.T) {
	a, _, client := newTwoFencedReplicas(t, "node-a", "node-b")
	rox := mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, "ext4")
	id := a.newVolume(client, "pvc-21000000-0000-4000-8000-000000000007", corev1.ReadOnlyMany, false)
	for _, n := range []string{nodeA, nodeB} {
		resp, err := a.publish(id, n, rox)
		if err != nil {
			t.Fatal(err)
		}
		if resp.PublishContext[PublishContextHostNQN] == "" {
			t.Fatalf("reader %s got no attachment host NQN", n)
		}
		wantExport(t, a, id, true, "")
	}
	a.waitClaims(id, "node-a", "node-b")
	if n, err := a.fence.Reconcile(context.Background(), nil); err != nil || n != 0 {
		t.Fatalf("reconcile of a read-only volume's readers = %d, %v; want nothing to fix", n, err)
	}
	wantExport(t, a, id, true, "")
	for _, n := range []string{nodeA, nodeB} {
		if err := a.unpublish(id, n); err != nil {
			t.Fatal(err)
		}
	}
	wantClosed(t, a, id)
}

// A publish whose read-back after its commit fails withdraws the claim it
// made: no orphaned claim is left for the leader's reconcile to open the
// export to. The interleaving: a paused replica's publish read the
// VolumeAttachment live, then the attachment was detached and its
// unpublish found no claim; the commit lands (the PV did not change), and
// the re-read after the commit fails (API timeout). The VolumeAttachment
// is gone, so nothing would retry or release a claim left behind.
func TestPublishWithdrawsItsClaimWhenTheReadBackFails(t *testing.T) {
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
