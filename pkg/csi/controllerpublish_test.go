package csi

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// TestPublishRules walks the publish policy through the real informers,
// index, claims and ControllerServer, asserting on what the API server
// holds and on the events an operator would see.
func TestPublishRules(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"), testNode("node-c"))
	e := newFixedPublishEnv(t, client, nil, fencing.DefaultConfig())
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	ctx := context.Background()

	id := e.newVolume(client, "pvc-0a1b2c3d-0000-4000-8000-000000000001", corev1.ReadWriteOnce, false)
	pv := "pvc-0a1b2c3d-0000-4000-8000-000000000001"

	// First publish: success, the claim is committed before the answer.
	resp, err := e.publish(id, "node-a", rwo)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.PublishContext[PublishContextNQN]; got != testNQNPrefix+id {
		t.Fatalf("publish_context nqn %q", got)
	}
	if c := claimsOf(t, client, pv); len(c) != 1 || c["node-a"].At.IsZero() {
		t.Fatalf("claims after publish: %v", c)
	}
	if _, err := putVA(ctx, client, testVA(pv, "node-a", publishNow.Add(-time.Minute))); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(id, "node-a")
	waitFor(t, "the VolumeAttachment in the index", func() bool { return len(e.index.Volume(id).Attachments) == 1 })

	// Same node again: success, same publish_context, and no RDS round
	// trip: the indexed PV says the volume exists.
	e.rds.mu.Lock()
	rdsCalls := e.rds.calls["GetDisk"]
	e.rds.mu.Unlock()
	again, err := e.publish(id, "node-a", rwo)
	if err != nil {
		t.Fatal(err)
	}
	e.rds.mu.Lock()
	if got := e.rds.calls["GetDisk"]; got != rdsCalls {
		t.Errorf("publishing an indexed volume asked the RDS %d times", got-rdsCalls)
	}
	e.rds.mu.Unlock()
	if fmt.Sprint(again.PublishContext) != fmt.Sprint(resp.PublishContext) {
		t.Fatalf("publish_context changed: %v vs %v", again.PublishContext, resp.PublishContext)
	}

	// Another healthy node: FAILED_PRECONDITION naming the holder, and a
	// Warning event on the PV and the PVC.
	e.drainEvents()
	_, err = e.publish(id, "node-b", rwo)
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node-a") {
		t.Fatalf("publish to node-b while node-a holds it: %v", err)
	}
	if ev := e.drainEvents(); !hasEvent(ev, "Warning", fencing.ReasonAttachConflict, "node-a") || len(ev) != 2 {
		t.Fatalf("conflict events (want one on the PV, one on the PVC): %v", ev)
	}

	// The refused node's VolumeAttachment (never attached) is a request,
	// not a hold: the holder may still publish again.
	refusedVA := testVA(pv, "node-b", publishNow)
	refusedVA.Status.Attached = false
	if _, err := putVA(ctx, client, refusedVA); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the refused VolumeAttachment in the index", func() bool { return len(e.index.Volume(id).Attachments) == 2 })
	if _, err := e.publish(id, "node-a", rwo); err != nil {
		t.Fatalf("the holder's publish was blocked by a refused node's pending VolumeAttachment: %v", err)
	}
	if err := client.StorageV1().VolumeAttachments().Delete(ctx, refusedVA.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// A late unpublish from a node that is not the holder changes nothing.
	if err := e.unpublish(id, "node-b"); err != nil {
		t.Fatal(err)
	}
	if c := claimsOf(t, client, pv); len(c) != 1 || c["node-a"].At.IsZero() {
		t.Fatalf("a non-holder's unpublish disturbed the holder: %v", c)
	}

	// The holder's node is deleted: the Fencer releases its claim at once
	// (event-driven), and a publish to node-b fences the stale attachment.
	if err := client.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(id)
	if _, err := e.publish(id, "node-b", rwo); err != nil {
		t.Fatalf("publish after the holder's node was deleted: %v", err)
	}
	if c := claimsOf(t, client, pv); len(c) != 1 || c["node-b"].At.IsZero() {
		t.Fatalf("claims after fenced handoff: %v", c)
	}
	if ev := e.drainEvents(); !hasEvent(ev, fencing.ReasonFenced, "node-a", "deleted") || !hasEvent(ev, fencing.ReasonAttached, "node-b") {
		t.Fatalf("fence events: %v", ev)
	}

	// Out of service: node-b is tainted; node-c gets the volume.
	e.waitClaims(id, "node-b")
	nb, _ := client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
	nb.Spec.Taints = append(nb.Spec.Taints, corev1.Taint{Key: "node.kubernetes.io/out-of-service", Effect: corev1.TaintEffectNoExecute})
	if _, err := client.CoreV1().Nodes().Update(ctx, nb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node-b out of service in the index", func() bool { return e.index.Node("node-b").OutOfService })
	e.waitClaims(id) // the Fencer released node-b's claim
	if _, err := e.publish(id, "node-c", rwo); err != nil {
		t.Fatalf("publish after the holder was tainted out-of-service: %v", err)
	}
	if c := claimsOf(t, client, pv); len(c) != 1 || c["node-c"].At.IsZero() {
		t.Fatalf("claims after out-of-service handoff: %v", c)
	}

	// Unpublish by the holder releases the claim; detaching twice is fine.
	for i := 0; i < 2; i++ {
		if err := e.unpublish(id, "node-c"); err != nil {
			t.Fatal(err)
		}
	}
	if c := claimsOf(t, client, pv); len(c) != 0 {
		t.Fatalf("claims after unpublish: %v", c)
	}
}

// TestPublishWaitsForCompletedDetach is the rule that replaced the
// grace-period handoff (the e2e failover found node-2 and node-3 attached
// at once with it): a holder whose VolumeAttachment is being deleted, but
// is still attached, blocks the next node however recent the deletion and
// even with its claim already released (an unpublish that succeeded but
// whose answer never reached the attacher). Only the completed detach,
// attached=false, hands the volume on.
func TestPublishWaitsForCompletedDetach(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"))
	e := newFixedPublishEnv(t, client, nil, fencing.DefaultConfig())
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	ctx := context.Background()
	const pv = "pvc-0a1b2c3d-0000-4000-8000-000000000011"
	id := e.newVolume(client, pv, corev1.ReadWriteOnce, false)
	va := testVA(pv, "node-a", publishNow.Add(-time.Hour))
	del := metav1.NewTime(publishNow.Add(-time.Second))
	va.DeletionTimestamp = &del
	va.Finalizers = []string{"external-attacher/rds-csi-srvlab-io"}
	va, err := putVA(ctx, client, va)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the detaching VolumeAttachment in the index", func() bool { return len(e.index.Volume(id).Attachments) == 1 })
	if _, err := e.publish(id, "node-b", rwo); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node-a") {
		t.Fatalf("publish to node-b while node-a's detach is pending: %v, want FAILED_PRECONDITION naming node-a", err)
	}
	va.Status.Attached = false
	if _, err := client.StorageV1().VolumeAttachments().Update(ctx, va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the completed detach in the index", func() bool { a, _ := e.index.Volume(id).AttachmentOn("node-a"); return !a.Attached })
	if _, err := e.publish(id, "node-b", rwo); err != nil {
		t.Fatalf("publish to node-b after node-a's detach completed: %v", err)
	}
}

// TestPublishLiveMigration: a raw-block ReadWriteMany volume may be on two
// nodes (KubeVirt live migration), never three, and not past the
// migration timeout, which is measured from the VolumeAttachments'
// creation times and so holds across a controller restart.
func TestPublishLiveMigration(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"), testNode("node-c"))
	e := newFixedPublishEnv(t, client, nil, fencing.DefaultConfig())
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	ctx := context.Background()
	pv := "pvc-0a1b2c3d-0000-4000-8000-000000000021"
	id := e.newVolume(client, pv, corev1.ReadWriteMany, true)

	if _, err := e.publish(id, "node-a", rwx); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(id, "node-a")
	e.drainEvents()
	if _, err := e.publish(id, "node-b", rwx); err != nil {
		t.Fatalf("second node of a live migration: %v", err)
	}
	if !hasEvent(e.drainEvents(), fencing.ReasonMigrationStarted, "node-a", "node-b") {
		t.Fatal("no migration event")
	}
	e.waitClaims(id, "node-a", "node-b")
	if _, err := e.publish(id, "node-c", rwx); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "two nodes") {
		t.Fatalf("third node: %v", err)
	}
	// Filesystem volumes are never multi-writer.
	if _, err := e.publish(id, "node-c", mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "ext4")); code(err) != codes.InvalidArgument {
		t.Fatalf("filesystem multi-writer publish: %v", err)
	}

	// The migration ends: node-a detaches, the finish is reported.
	if err := e.unpublish(id, "node-a"); err != nil {
		t.Fatal(err)
	}
	if !hasEvent(e.drainEvents(), fencing.ReasonMigrationFinished) {
		t.Fatal("no migration-finished event")
	}

	// A migration that started 6 minutes ago (VA timestamps), seen by a
	// freshly started controller: the target may not stay on past the
	// 5-minute timeout.
	pv2 := "pvc-0a1b2c3d-0000-4000-8000-000000000022"
	id2 := e.newVolume(client, pv2, corev1.ReadWriteMany, true)
	for node, age := range map[string]time.Duration{"node-a": time.Hour, "node-b": 6 * time.Minute} {
		if _, err := putVA(ctx, client, testVA(pv2, node, publishNow.Add(-age))); err != nil {
			t.Fatal(err)
		}
	}
	e.close()
	restarted := newFixedPublishEnv(t, client, e.rds, fencing.DefaultConfig())
	waitFor(t, "both attachments in the new index", func() bool {
		v := restarted.index.Volume(id2)
		return v != nil && len(v.Attachments) == 2
	})
	if _, err := restarted.publish(id2, "node-b", rwx); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "migration timeout") {
		t.Fatalf("publish past the migration timeout after a restart: %v", err)
	}
}

// TestPublishRequestErrors: bad requests get the right codes and change
// nothing.
func TestPublishRequestErrors(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e := newFixedPublishEnv(t, client, nil, fencing.DefaultConfig())
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	pv := "pvc-0a1b2c3d-0000-4000-8000-000000000031"
	id := e.newVolume(client, pv, corev1.ReadWriteOnce, false)

	for _, tc := range []struct {
		name string
		req  *csi.ControllerPublishVolumeRequest
		want codes.Code
	}{
		{"no volume", &csi.ControllerPublishVolumeRequest{NodeId: "node-a", VolumeCapability: rwo}, codes.InvalidArgument},
		{"no node", &csi.ControllerPublishVolumeRequest{VolumeId: id, VolumeCapability: rwo}, codes.InvalidArgument},
		{"no capability", &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a"}, codes.InvalidArgument},
		{"unsupported filesystem", &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a",
			VolumeCapability: mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ntfs")}, codes.InvalidArgument},
		{"unknown volume", &csi.ControllerPublishVolumeRequest{VolumeId: "pvc-0a1b2c3d-0000-4000-8000-0000000000ff", NodeId: "node-a", VolumeCapability: rwo}, codes.NotFound},
		{"malformed volume ID", &csi.ControllerPublishVolumeRequest{VolumeId: "x;rm", NodeId: "node-a", VolumeCapability: rwo}, codes.NotFound},
		{"unknown node", &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-zz", VolumeCapability: rwo}, codes.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := e.cs.ControllerPublishVolume(context.Background(), tc.req); code(err) != tc.want {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := e.cs.ControllerUnpublishVolume(context.Background(), &csi.ControllerUnpublishVolumeRequest{NodeId: "node-a"}); code(err) != codes.InvalidArgument {
		t.Fatalf("unpublish without volume: %v", err)
	}

	// A second operation on the same volume while one is in flight.
	release, ok := e.cs.inflight.TryAcquire(volumeKey(id))
	if !ok {
		t.Fatal("reserve")
	}
	if _, err := e.publish(id, "node-a", rwo); code(err) != codes.Aborted {
		t.Fatalf("concurrent publish: %v", err)
	}
	if err := e.unpublish(id, "node-a"); code(err) != codes.Aborted {
		t.Fatalf("concurrent unpublish: %v", err)
	}
	release()

	// An index that has not synced answers UNAVAILABLE.
	e.cs.pub.Synced = func() bool { return false }
	if _, err := e.publish(id, "node-a", rwo); code(err) != codes.Unavailable {
		t.Fatalf("publish before sync: %v", err)
	}
	if c := claimsOf(t, client, pv); len(c) != 0 {
		t.Fatalf("a refused request left claims: %v", c)
	}
}

// TestPublishNotAdvertisedWithoutIndex: without the index the capability
// is not advertised and the RPCs do not pretend.
func TestPublishNotAdvertisedWithoutIndex(t *testing.T) {
	s, _ := newTestController(t)
	caps, _ := s.ControllerGetCapabilities(context.Background(), nil)
	for _, c := range caps.Capabilities {
		if c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME {
			t.Fatal("PUBLISH_UNPUBLISH_VOLUME advertised without the attachment index")
		}
	}
	if _, err := s.ControllerPublishVolume(context.Background(), &csi.ControllerPublishVolumeRequest{}); code(err) != codes.Unimplemented {
		t.Fatalf("publish without index: %v", err)
	}
	client := newFakeAPI()
	e := newPublishEnv(t, client, nil, fencing.DefaultConfig())
	caps, _ = e.cs.ControllerGetCapabilities(context.Background(), nil)
	found := false
	for _, c := range caps.Capabilities {
		found = found || c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME
	}
	if !found {
		t.Fatal("PUBLISH_UNPUBLISH_VOLUME not advertised with the index")
	}
}

// TestStageContextPrefersPublishContext: NodeStage connects to the target
// the controller named at attach time when it differs from the one the PV
// recorded at provisioning.
func TestStageContextPrefersPublishContext(t *testing.T) {
	vc := map[string]string{VolumeContextNVMeAddress: "10.0.0.5", VolumeContextNVMePort: "4420", VolumeContextNQN: "nqn.x:pvc-1"}
	pc := map[string]string{PublishContextNVMeAddress: "10.0.0.6"}
	got := stageContext(vc, pc)
	if got[VolumeContextNVMeAddress] != "10.0.0.6" || got[VolumeContextNVMePort] != "4420" || got[VolumeContextNQN] != "nqn.x:pvc-1" {
		t.Fatalf("merged %v", got)
	}
	if vc[VolumeContextNVMeAddress] != "10.0.0.5" {
		t.Fatal("the volume_context was modified")
	}
	if got := stageContext(vc, nil); got[VolumeContextNVMeAddress] != "10.0.0.5" {
		t.Fatalf("without publish_context: %v", got)
	}
}

// TestRepeatedPublishSucceeds: the same publish sent again at once (the
// CO's retry, csi-sanity's idempotency check) succeeds even when the index
// has not yet seen the first one's claim: the conflicting write is waited
// for and the decision made again, instead of answering ABORTED.
func TestRepeatedPublishSucceeds(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e := newFixedPublishEnv(t, client, nil, fencing.DefaultConfig())
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("pvc-0a1b2c3d-0000-4000-8000-%012d", 400+i)
		id := e.newVolume(client, name, corev1.ReadWriteOnce, false)
		for j := 0; j < 3; j++ {
			if _, err := e.publish(id, "node-a", rwo); err != nil {
				t.Fatalf("publish %d of %s: %v", j+1, id, err)
			}
		}
		if c := claimsOf(t, client, name); len(c) != 1 || c["node-a"].At.IsZero() {
			t.Fatalf("claims of %s: %v", name, c)
		}
	}
}

// A commit the API server fails (neither a conflict nor an answer) reaches
// the attacher as UNAVAILABLE, naming the volume and node: it is retried.
func TestFailedCommitIsUnavailable(t *testing.T) {
	client := newFakeAPI(testNode(nodeA))
	e := newPublishEnv(t, client, nil, fencing.DefaultConfig())
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000604", corev1.ReadWriteOnce, false)
	client.PrependReactor("patch", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewInternalError(context.DeadlineExceeded)
	})
	_, err := e.publish(id, nodeA, rwo)
	if got := status.Code(toStatus(err)); got != codes.Unavailable || !strings.Contains(err.Error(), id) || !strings.Contains(err.Error(), nodeA) {
		t.Fatalf("publish whose commit failed: %v (code %v); want UNAVAILABLE naming %s and %s", err, got, id, nodeA)
	}
}

// A repeated publish that drops a stale holder's claim with its commit
// (storage fencing off) reports the fence as the node fencer would.
func TestRepeatedPublishReportsTheFenceItMade(t *testing.T) {
	client := newFakeAPI(testNode(nodeA), testNode(nodeB))
	e := newPublishEnvWith(t, client, nil, fencing.DefaultConfig(), testOptions(), withoutNodeFencer) // only the publish fences here
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000605", corev1.ReadWriteMany, true)
	for _, n := range []string{nodeA, nodeB} {
		if _, err := e.publish(id, n, rwx); err != nil {
			t.Fatal(err)
		}
	}
	e.waitClaims(id, nodeA, nodeB)
	e.drainEvents()
	if err := client.CoreV1().Nodes().Delete(context.Background(), nodeB, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the index to see node-b gone", func() bool { return !e.index.Node(nodeB).Exists })
	if _, err := e.publish(id, nodeA, rwx); err != nil {
		t.Fatal(err)
	}
	if _, held := claimsOf(t, client, id)[nodeB]; held {
		t.Fatal("the deleted node's claim stayed")
	}
	if ev := e.drainEvents(); !hasEvent(ev, fencing.ReasonFenced, nodeB) {
		t.Fatalf("events %q; want %s for %s", ev, fencing.ReasonFenced, nodeB)
	}
}
