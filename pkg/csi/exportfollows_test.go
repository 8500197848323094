package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

var vaGVR = schema.GroupVersionResource{Group: "storage.k8s.io", Version: "v1", Resource: "volumeattachments"}

func exportOpen(host string) rds.ExportState { return rds.ExportState{Open: true, Host: host} }
func exportClosed() rds.ExportState {
	return rds.ExportState{Host: "nqn.2014-08.org.nvmexpress:uuid:00000000-dead-4000-8000-000000000000"}
}

// waitIndexed waits until this replica's index knows volume id.
func (e *publishEnv) waitIndexed(id string) {
	e.t.Helper()
	waitFor(e.t, "the index to know "+id, func() bool { return e.index.Volume(id).Indexed() })
}

// Issue 21: the export follows the claims. Two replicas with storage
// fencing share one API server and one RDS; a held SwapExport lands late,
// after the other replica moved on, exactly as a slow RouterOS command.

func newTwoFencedReplicas(t *testing.T, nodes ...string) (*publishEnv, *publishEnv, *fake.Clientset) {
	t.Helper()
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, testNode(n))
	}
	client := newFakeAPI(objs...)
	shared := newFakeRDS(1 << 40)
	a := newPublishEnvWith(t, client, shared, fencing.DefaultConfig(), allowHostOptions())
	b := newPublishEnvWith(t, client, shared, fencing.DefaultConfig(), allowHostOptions())
	return a, b, client
}

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

// migrateAToB publishes raw-block RWX volume id to node-a, then to node-b
// (a live migration's target) and waits until this replica's index shows
// both claims; the export must then allow node-b's attachment. It returns
// both attachments' host NQNs.
func (e *publishEnv) migrateAToB(id string) (hostA, hostB string) {
	e.t.Helper()
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	if _, err := e.publish(id, nodeA, rwx); err != nil {
		e.t.Fatal(err)
	}
	e.waitClaims(id, "node-a")
	if _, err := e.publish(id, nodeB, rwx); err != nil {
		e.t.Fatal(err)
	}
	e.waitClaims(id, "node-a", "node-b")
	hostA, hostB = e.hostOf(id, "node-a"), e.hostOf(id, "node-b")
	wantExport(e.t, e, id, true, hostB)
	return hostA, hostB
}
