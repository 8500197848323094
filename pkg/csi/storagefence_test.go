package csi

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// Issue 12: every export was open to any host, a new one too.
func TestStorageFencingNewVolumeIsExportedToNoHost(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000001", corev1.ReadWriteOnce, false)
	d := e.disk(id)
	if d.Exported || d.Port != 4420 || d.NQN != testNQNPrefix+id {
		t.Fatalf("new volume: %+v; want not exported, with port 4420 and NQN %s set", d, testNQNPrefix+id)
	}
	// A repeated CreateVolume finds it as it is (closed is expected).
	if _, err := e.cs.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "pvc-5f000000-0000-4000-8000-000000000001",
		VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")}}); err != nil {
		t.Fatalf("repeated CreateVolume of a closed volume: %v", err)
	}
	// And its health is not "not exported".
	resp, err := e.cs.ControllerGetVolumeHealth(context.Background(), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
	if err != nil || len(resp.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Fatalf("health of a closed, unpublished volume: %v, %v", resp.GetVolumeHealth().GetHealthStatuses(), err)
	}
}

func TestStorageFencingPublishOpensTheExportToTheNodeOnly(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000002", corev1.ReadWriteOnce, false)

	// A node plugin from before per-attachment host NQNs (its node ID
	// carries its own NQN, which it would connect with) is refused, and
	// nothing opens.
	_, err := e.publish(id, "node-b/"+nqnB, rwo)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("publish to a node plugin from before per-attachment host NQNs = %v, want FailedPrecondition", err)
	}
	wantClosed(t, e, id)

	first, err := e.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	// The export allows the attachment's own host NQN, handed to the node
	// in publish_context; the claim records only its nonce, not the NQN
	// (nor the node's own).
	host := e.hostOf(id, "node-a")
	wantExport(t, e, id, true, host)
	if got := first.PublishContext[PublishContextHostNQN]; got != host || host == nqnA {
		t.Fatalf("publish_context host NQN %q, export %q; want the attachment's own, not the node's %s", got, host, nqnA)
	}
	if c := claimsOf(t, client, id)["node-a"]; c.HostNQN != "" || c.Nonce == "" {
		t.Fatalf("node-a's claim records host %q, nonce %q; want no host NQN, a nonce", c.HostNQN, c.Nonce)
	}
	// A repeated publish changes nothing on the RDS: node-a keeps its
	// connection, and gets the same host NQN.
	e.waitClaims(id, "node-a")
	again, err := e.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.PublishContext[PublishContextHostNQN]; got != host {
		t.Fatalf("repeated publish: host NQN %q, want the attachment's %q", got, host)
	}
	if n := e.drops(id); n != 0 {
		t.Fatalf("%d connection drops after publishing to node-a twice, want 0", n)
	}
	// Unpublish closes it again.
	if err := e.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, e, id)
}

func TestStorageFencingFailsClosed(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000003", corev1.ReadWriteOnce, false)

	e.rds.failNext("SwapExport", errors.New("ssh: connection refused"))
	if _, err := e.publish(id, nodeA, rwo); status.Code(err) != codes.Unavailable {
		t.Fatalf("publish while the RDS cannot be told = %v, want Unavailable", err)
	}
	wantClosed(t, e, id)

	// An export that changed under the swap is read again and re-derived
	// from the live claims.
	e.rds.failNext("SwapExport", rds.ErrExportChanged)
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatalf("publish while the export changed under it once = %v, want it re-derived", err)
	}
	wantExport(t, e, id, true, e.hostOf(id, "node-a"))
}

// Issue 12: Kubernetes force-detaches a node after 6 minutes; the attacher
// unpublishes, the claim goes, and the volume attaches elsewhere while the
// old node may still be alive and connected. Its host must be cut off
// before the new node is told it may write.
func TestStorageFencingForceDetachedNodeIsCutOff(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000004", corev1.ReadWriteOnce, false)
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(id, "node-a")
	// The force-detach: no VolumeAttachment stands, node-a never unstaged.
	if err := e.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, e, id)
	if n := e.drops(id); n != 1 {
		t.Fatalf("node-a's connection was dropped %d times by the forced unpublish, want 1", n)
	}
	e.waitClaims(id)
	if _, err := e.publish(id, nodeB, rwo); err != nil {
		t.Fatal(err)
	}
	wantExport(t, e, id, true, e.hostOf(id, "node-b"))
}

// A fence cuts the fenced host off the RDS before it releases the claim,
// and the next node's publish then opens the export to that node alone.
func TestStorageFencingFenceCutsOffBeforeReleasing(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000005", corev1.ReadWriteOnce, false)
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	if _, err := putVA(context.Background(), client, testVA(id, "node-a", testClock)); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(id, "node-a")

	cut := e.rds.holdNext("SwapExport")
	taintNode(t, client, "node-a", fencing.OutOfServiceTaint, "nodeshutdown")
	<-cut.entered
	if _, held := claimsOf(t, client, id)["node-a"]; !held {
		t.Fatal("node-a's claim was released before its host was cut off the RDS")
	}
	close(cut.release)
	e.waitClaims(id)
	wantClosed(t, e, id)

	if _, err := e.publish(id, nodeB, rwo); err != nil {
		t.Fatal(err)
	}
	wantExport(t, e, id, true, e.hostOf(id, "node-b"))
}

// A fence whose cut fails keeps the claim and is retried.
func TestStorageFencingFailedCutKeepsTheClaim(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000006", corev1.ReadWriteOnce, false)
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(id, "node-a")
	first := e.rds.holdNext("SwapExport")
	taintNode(t, client, "node-a", fencing.OutOfServiceTaint, "nodeshutdown")
	<-first.entered
	// The first cut fails; the fence is retried, and at the retry's cut
	// the claim must still be there.
	e.rds.failNext("SwapExport", errors.New("ssh: connection refused"))
	second := e.rds.holdNext("SwapExport")
	close(first.release)
	<-second.entered
	if _, held := claimsOf(t, client, id)["node-a"]; !held {
		t.Fatal("node-a's claim was released although cutting its host off failed")
	}
	close(second.release)
	e.waitClaims(id)
	wantClosed(t, e, id)
}

// A raw-block RWX volume on two nodes (a live migration): the export moves
// to the target without dropping the source's connection (one allowed host
// per disk; any host would let a fenced node back in). When the source
// leaves from a Ready node nothing changes; when the target is detached
// from a node that is not Ready (it may still be connected), the export
// goes back to the source with a drop.
func TestStorageFencingMigration(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000007", corev1.ReadWriteMany, true)
	migrate := func() {
		t.Helper()
		if _, err := e.publish(id, nodeA, rwx); err != nil {
			t.Fatal(err)
		}
		e.waitClaims(id, "node-a")
		if _, err := e.publish(id, nodeB, rwx); err != nil {
			t.Fatal(err)
		}
		wantExport(t, e, id, true, e.hostOf(id, "node-b"))
		e.waitClaims(id, "node-a", "node-b")
	}
	migrate()
	if err := e.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	wantExport(t, e, id, true, e.hostOf(id, "node-b"))
	if n := e.drops(id); n != 0 {
		t.Fatalf("%d connection drops during a completed migration, want 0", n)
	}
	if err := e.unpublish(id, nodeB); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(id)

	// Again, and the target's node dies: its detach (forced) moves the
	// export back to the source, dropping connections.
	drops := e.drops(id)
	migrate()
	setReady(t, client, "node-b", corev1.ConditionUnknown, time.Now())
	if err := e.unpublish(id, nodeB); err != nil {
		t.Fatal(err)
	}
	wantExport(t, e, id, true, e.hostOf(id, "node-a"))
	if n := e.drops(id) - drops; n != 1 {
		t.Fatalf("%d connection drops since the second migration began, want 1: node-b, detached while NotReady, cut off", n)
	}
}

// With --out-of-service-taint, a NotReady fence that cut the node off
// every volume taints it out of service, so Kubernetes moves its pods and
// volumes at once; not while it has another driver's volumes; and the
// taint goes when the node is Ready again.
func TestOutOfServiceTaintAfterNotReadyFence(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.NotReadyThreshold = time.Second
	for _, foreign := range []bool{false, true} {
		client := newFakeAPI(testNode("node-a"))
		e := newFencedEnv(t, client, policy, true)
		rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
		id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000008", corev1.ReadWriteOnce, false)
		if _, err := e.publish(id, nodeA, rwo); err != nil {
			t.Fatal(err)
		}
		e.waitClaims(id, "node-a")
		if foreign {
			va := testVA("other-pv", "node-a", testClock)
			va.Name, va.Spec.Attacher = "csi-other", "other.csi.example.com"
			if _, err := putVA(context.Background(), client, va); err != nil {
				t.Fatal(err)
			}
		}
		setReady(t, client, "node-a", corev1.ConditionUnknown, time.Now().Add(-time.Hour))
		e.waitClaims(id)
		wantClosed(t, e, id)
		if foreign {
			// The fence is done (claim released, host cut off); the taint
			// decision came after it, in the same reaction.
			waitFor(t, "the reaction to finish", func() bool { return e.ctrl.ReactionsIdle() })
			if n := nodeTaint(t, client, "node-a"); n != nil {
				t.Fatalf("node-a tainted %+v although it has another driver's volume", n)
			}
			continue
		}
		waitFor(t, "node-a tainted out of service", func() bool { return nodeTaint(t, client, "node-a") != nil })
		if tt := nodeTaint(t, client, "node-a"); tt.Value != fencing.DriverOutOfServiceValue || tt.Effect != corev1.TaintEffectNoExecute {
			t.Fatalf("taint %+v", tt)
		}
		setReady(t, client, "node-a", corev1.ConditionTrue, time.Now())
		waitFor(t, "the driver's taint removed from node-a", func() bool { return nodeTaint(t, client, "node-a") == nil })
	}
}

func nodeTaint(t *testing.T, client *fake.Clientset, node string) *corev1.Taint {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range n.Spec.Taints {
		if tt.Key == fencing.OutOfServiceTaint {
			return &tt
		}
	}
	return nil
}

// Volumes made before storage fencing was turned on are open to any host;
// the leader closes those no node claims or attaches, and only those.
func TestReconcileClosesUnclaimedExports(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	idle := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000009", corev1.ReadWriteOnce, false)
	used := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000010", corev1.ReadWriteOnce, false)
	for _, id := range []string{idle, used} {
		d := e.disk(id)
		d.Exported = true // as created without storage fencing
		e.rds.putDisk(d)
	}
	// used is attached (its claim from before storage fencing has no NQN).
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), used, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Annotations = map[string]string{claims.ClaimsAnnotation: `{"node-a":"2026-11-01T00:00:00Z"}`}
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(used, "node-a")
	var found []storagefence.Mismatch
	n, err := e.fence.Reconcile(context.Background(), func(m storagefence.Mismatch) { found = append(found, m) })
	if err != nil || n != 1 || len(found) != 1 || found[0].Volume != idle {
		t.Fatalf("Reconcile = %d, %v, reported %+v; want 1 fixed: %s", n, err, found, idle)
	}
	wantClosed(t, e, idle)
	wantExport(t, e, used, true, "")
	// Again: nothing left to fix.
	if n, err := e.fence.Reconcile(context.Background(), nil); err != nil || n != 0 {
		t.Fatalf("second Reconcile = %d, %v; want 0", n, err)
	}
}

// A volume attached before storage fencing was turned on (a claim without
// a host NQN) stays open to any host when its other node leaves, instead
// of failing the detach for ever.
func TestStorageFencingLegacyHolderStaysOpen(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000011", corev1.ReadWriteMany, true)
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Annotations = map[string]string{claims.ClaimsAnnotation: `{"node-a":{"at":"2026-11-01T00:00:00Z","cap":"block/MULTI_NODE_MULTI_WRITER"}}`}
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := e.disk(id)
	d.Exported = true
	e.rds.putDisk(d)
	e.waitClaims(id, "node-a")
	if _, err := e.publish(id, nodeB, rwx); err != nil {
		t.Fatal(err)
	}
	wantExport(t, e, id, true, e.hostOf(id, "node-b"))
	e.waitClaims(id, "node-a", "node-b")
	if err := e.unpublish(id, nodeB); err != nil {
		t.Fatalf("unpublish leaving a holder from before storage fencing: %v", err)
	}
	wantExport(t, e, id, true, "")
}

// A fence that gives up after its cut landed (the node recovered, and its
// repeated publish renewed the claim and was answered OK meanwhile) still
// settles the export on the live claims: the holder is let in again at
// once, not at the leader's next reconcile.
func TestFenceThatGivesUpReopensTheExportToTheHolder(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000602", corev1.ReadWriteOnce, false)
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(id, nodeA)

	cut := e.rds.holdNext("SwapExport")
	taintNode(t, client, nodeA, fencing.OutOfServiceTaint, "nodeshutdown")
	<-cut.entered
	untaintNode(t, client, nodeA)
	waitFor(t, "the index to see node-a in service", func() bool { return !e.index.Node(nodeA).OutOfService })
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatalf("the repeated publish of the recovered holder: %v", err)
	}
	close(cut.release)
	waitFor(t, "the fence to finish", func() bool { return e.ctrl.ReactionsIdle() })
	if _, held := claimsOf(t, client, id)[nodeA]; !held {
		t.Fatal("the recovered holder's claim was released")
	}
	wantExport(t, e, id, true, e.hostOf(id, nodeA))
}

func untaintNode(t *testing.T, client *fake.Clientset, node string) {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = nil
	if _, err := client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A publish that fences a node drops that node's claim with its commit;
// the fenced host's connection is dropped all the same when the cut that
// follows is lost (the RDS command timed out and never lands), although
// nothing that comes after the commit sees a node left to cut (the
// publish's retry no longer sees a node to fence, the node fencer sees no
// claim, the reconcile sees the export matching the claims). Here the
// export is parked on its way from node-a to node-b (a migration's target
// joining on replica a, its open of node-b in flight); node-a is put out
// of service; a repeated publish of node-b on replica b fences node-a,
// its commit drops node-a's claim, and its cut (park -> closed) is lost.
// The in-flight park -> open(node-b) lands: replica a answers node-b OK
// and the export allows node-b, while a park keeps connections, and so
// does the move from it. Then Kubernetes force-detaches node-a (as the
// out-of-service taint makes it do; its unpublish finds no claim), the
// leader reconciles and the attacher retries node-b: by then node-a must
// have been dropped, or it writes beside node-b.
// A publish's fence cuts before its commit drops the claim: a lost cut
// keeps the claim, and the attacher's retry fences again, cut included.
func TestPublishFenceWhoseCutIsLostStillDropsTheFencedHost(t *testing.T) {
	a, b, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000003", corev1.ReadWriteMany, true)
	b.waitIndexed(id)
	if _, err := a.publish(id, nodeA, rwx); err != nil {
		t.Fatal(err)
	}
	hostA := a.hostOf(id, "node-a")
	wantExport(t, a, id, true, hostA) // node-a connects
	drops := a.drops(id)

	// node-b joins (a live migration's target) on replica a: the park
	// lands, its open of node-b is held in flight.
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
	parked := a.disk(id)
	if !parked.Exported || !a.fence.ParkedFrom(id, parked.AllowHost, hostA) {
		t.Fatalf("export %+v; want parked on the way from node-a", parked)
	}

	// node-a goes out of service; replica b sees it and both claims.
	taintNode(t, client, "node-a", "node.kubernetes.io/out-of-service", "nodeshutdown")
	b.waitClaims(id, "node-a", "node-b")
	waitFor(t, "replica b to see node-a out of service", func() bool { return b.index.Node("node-a").OutOfService })
	// A repeated publish of node-b on replica b fences node-a; its cut
	// times out and is lost.
	b.rds.failNext("SwapExport", fmt.Errorf("exporting disk: %w: command timed out after it was sent", rds.ErrOutcomeUnknown))
	_, err := b.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeB, VolumeCapability: rwx})
	if err == nil {
		t.Fatal("the publish whose cut was lost answered success")
	}
	if _, held := claimsOf(t, client, id)["node-a"]; !held {
		t.Fatalf("node-a's claim was released although the cut before it was lost (%v)", err)
	}

	// The open in flight lands; replica a answers node-b.
	close(open.release)
	if err := <-answered; err != nil {
		t.Logf("node-b's first publish: %v", err)
	}
	// The attacher retries node-b on replica b: the fence of node-a, its
	// cut included, runs again.
	if _, err := b.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeB, VolumeCapability: rwx}); err != nil {
		t.Logf("node-b's retry on replica b: %v", err)
	}
	// Kubernetes acts on the out-of-service taint: node-a's pods go and
	// its VolumeAttachment is force-detached (its unpublish finds no claim
	// to release). Then the leader's reconcile, and the attacher's retry
	// of node-b (the replica b's failed answer).
	if err := b.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	if _, err := a.fence.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.publish(id, nodeB, rwx); err != nil {
		t.Fatal(err)
	}
	if a.drops(id) == drops {
		t.Errorf("node-a was fenced (its claim released by node-b's publish) but its connection was never dropped: the export went %s -> park -> %s without a drop, and it still writes beside node-b", hostA, a.disk(id).AllowHost)
	}
}

// The same without a late command: a migration has moved the export to
// its target node-b; the source node-a keeps its connection (as
// designed). node-a is put out of service. A repeated publish of node-b
// (its first answer was lost, or it failed after the export moved) fences
// node-a: the commit drops node-a's claim, then the cut (open(node-b) ->
// closed) fails. The export already matches the only live claim, so
// nothing that follows would drop node-a's connection by itself: not the
// force-detach of node-a (no claim to release, so no shutOut), not the
// attacher's retry of node-b (no one left to fence), not the reconcile. A
// fence that released a claim does not leave its cut to chance.
// As above, a failed cut keeps the claim, and the retry cuts.
func TestPublishFenceWhoseCutFailsStillDropsTheMigrationSource(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, testNode("node-a"), testNode("node-b"))
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := a.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000004", corev1.ReadWriteMany, true)
	hostA, hostB := a.migrateAToB(id) // node-a stays connected, as hostA
	drops := a.drops(id)

	taintNode(t, client, "node-a", "node.kubernetes.io/out-of-service", "nodeshutdown")
	waitFor(t, "node-a out of service in the index", func() bool { return a.index.Node("node-a").OutOfService })
	a.rds.failNext("SwapExport", fmt.Errorf("exporting disk: %w: command timed out after it was sent", rds.ErrOutcomeUnknown))
	_, err := a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeB, VolumeCapability: rwx})
	if err == nil {
		if a.drops(id) == drops {
			t.Fatal("the repeated publish of node-b answered success without cutting node-a off")
		}
		return // cut off with a swap this fault did not hit
	}
	if _, held := claimsOf(t, client, id)["node-a"]; !held {
		t.Fatalf("node-a's claim was released although the cut before it failed (%v)", err)
	}
	// The attacher retries: the fence of node-a, its cut included, runs
	// again.
	if _, err := a.cs.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeB, VolumeCapability: rwx}); err != nil {
		t.Fatalf("the retried publish of node-b: %v", err)
	}
	a.waitClaims(id, "node-b")
	if err := a.unpublish(id, nodeA); err != nil { // the force-detach
		t.Fatal(err)
	}
	if _, err := a.fence.Reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.publish(id, nodeB, rwx); err != nil {
		t.Fatal(err)
	}
	if a.drops(id) == drops {
		t.Errorf("node-a was fenced (its claim released) but never cut off: the export allows %s (node-b) and node-a's connection as %s stands: two writers", hostB, hostA)
	}
}
