package csi

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// setAnnotation writes a raw annotation value on a PV (an operator's
// kubectl annotate, a tool with another format).
func setAnnotation(t *testing.T, client *fake.Clientset, pv, key, value string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().PersistentVolumes().Patch(context.Background(), pv, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func rawAnnotation(t *testing.T, client *fake.Clientset, pv, key string) string {
	t.Helper()
	p, err := client.CoreV1().PersistentVolumes().Get(context.Background(), pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Annotations[key]
}

// TestPublishFailsClosedOnUnreadableClaims: while a PV's claims
// annotation cannot be read, no node is given the volume, not another
// node and not the one the last readable claims named, and no unpublish
// writes over the annotation: each is FAILED_PRECONDITION naming the
// annotation and the PV. Fixed, the volume is decided on as usual.
func TestPublishFailsClosedOnUnreadableClaims(t *testing.T) {
	client := newFakeAPI(testNode(nodeA), testNode(nodeB))
	e := newPublishEnv(t, client, nil, fencing.DefaultConfig())
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	malformed := e.cs.pub.Malformed
	refused := func(what string, err error) {
		t.Helper()
		if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), claims.ClaimsAnnotation) {
			t.Errorf("%s: %v (code %v), want FAILED_PRECONDITION naming %s", what, err, code(err), claims.ClaimsAnnotation)
		}
	}

	// Indexed with node-a's claim, then the annotation is mangled.
	id := e.newVolume(client, "pvc-3a000000-0000-4000-8000-000000000001", corev1.ReadWriteOnce, false)
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	const broken = `{"node-a": 2024-01-01`
	setAnnotation(t, client, id, claims.ClaimsAnnotation, broken)
	waitFor(t, "the index to skip the unreadable PV", func() bool { return len(malformed.ForHandle(id)) == 1 })
	_, err := e.publish(id, nodeB, rwo)
	refused("publish to another node", err)
	_, err = e.publish(id, nodeA, rwo)
	refused("publish to the node the last readable claims named", err)
	refused("unpublish", e.unpublish(id, nodeA))
	if got := rawAnnotation(t, client, id, claims.ClaimsAnnotation); got != broken {
		t.Errorf("the unreadable annotation was written over: %q", got)
	}

	// Unreadable from its first version: never indexed, refused the same
	// way (not "not in the index yet", retried without end).
	id2 := "pvc-3a000000-0000-4000-8000-000000000002"
	if _, err := e.cs.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: id2, VolumeCapabilities: []*csi.VolumeCapability{rwo}}); err != nil {
		t.Fatal(err)
	}
	p := testPV(id2, id2, corev1.ReadWriteOnce, false)
	p.Annotations = map[string]string{claims.ClaimsAnnotation: `{"node-a": "yesterday"}`}
	if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the index to skip the second PV", func() bool { return len(malformed.ForHandle(id2)) == 1 })
	_, err = e.publish(id2, nodeB, rwo)
	refused("publish of a PV unreadable from the start", err)

	// Fixed: node-a's claim is back, node-b is refused for it (the
	// policy's refusal), node-a publishes again.
	setAnnotation(t, client, id, claims.ClaimsAnnotation, `{"node-a":"2026-11-22T12:00:00Z"}`)
	waitFor(t, "the fixed PV to be indexed", func() bool {
		v := e.index.Volume(id)
		return len(malformed.ForHandle(id)) == 0 && v != nil && v.Claims.Len() == 1
	})
	if _, err := e.publish(id, nodeB, rwo); code(err) != codes.FailedPrecondition || strings.Contains(err.Error(), claims.ClaimsAnnotation) {
		t.Errorf("publish to node-b after the fix: %v, want the policy's refusal (node-a holds it)", err)
	}
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Errorf("publish to node-a after the fix: %v", err)
	}
}

// TestUnreadableRetiringWithoutFencing: without storage fencing the
// retiring record is neither read nor written, so an unreadable one
// blocks nothing (it is still counted by the index).
func TestUnreadableRetiringWithoutFencing(t *testing.T) {
	client := newFakeAPI(testNode(nodeA))
	e := newPublishEnv(t, client, nil, fencing.DefaultConfig())
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-3a000000-0000-4000-8000-000000000003", corev1.ReadWriteOnce, false)
	setAnnotation(t, client, id, claims.RetiringAnnotation, "not json")
	waitFor(t, "the index to count the record", func() bool { return len(e.cs.pub.Malformed.ForHandle(id)) == 1 })
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Errorf("publish: %v", err)
	}
	if err := e.unpublish(id, nodeA); err != nil {
		t.Errorf("unpublish: %v", err)
	}
}

// TestUnreadableRetiringWithFencing: with storage fencing every claim
// change may write the retiring record, so an unreadable one blocks the
// volume like unreadable claims do, and is left as it is.
func TestUnreadableRetiringWithFencing(t *testing.T) {
	client := newFakeAPI(testNode(nodeA), testNode(nodeB))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-3a000000-0000-4000-8000-000000000004", corev1.ReadWriteOnce, false)
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	const broken = "[{not json"
	setAnnotation(t, client, id, claims.RetiringAnnotation, broken)
	waitFor(t, "the index to count the record", func() bool { return len(e.cs.pub.Malformed.ForHandle(id)) == 1 })
	for _, call := range []struct {
		what string
		err  func() error
	}{
		{"publish to another node", func() error { _, err := e.publish(id, nodeB, rwo); return err }},
		{"publish again to the holder", func() error { _, err := e.publish(id, nodeA, rwo); return err }},
		{"unpublish", func() error { return e.unpublish(id, nodeA) }},
	} {
		if err := call.err(); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), claims.RetiringAnnotation) {
			t.Errorf("%s: %v (code %v), want FAILED_PRECONDITION naming %s", call.what, err, code(err), claims.RetiringAnnotation)
		}
	}
	if got := rawAnnotation(t, client, id, claims.RetiringAnnotation); got != broken {
		t.Errorf("the unreadable record was written over: %q", got)
	}
}

// Without storage fencing nothing writes or needs the retiring
// annotation, so a stray or mangled value (an operator's kubectl
// annotate, a rollback from a release with another format) is not read
// and fails neither a release nor the informer's syncPV. Were it read,
// ControllerUnpublishVolume would fail (gRPC INTERNAL, on every retry)
// forever: the claim would stay, the VolumeAttachment never detach, and
// the volume could not move to another node.
func TestUnreadableRetiringDoesNotBlockADetachWithoutFencing(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e := newPublishEnv(t, client, nil, fencing.DefaultConfig())
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-2f000000-0000-4000-8000-0000000001a4", corev1.ReadWriteOnce, false)
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"metadata":{"annotations":{"` + claims.RetiringAnnotation + `":"not json"}}}`)
	if _, err := client.CoreV1().PersistentVolumes().Patch(context.Background(), id, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err := e.unpublish(id, nodeA)
	if err != nil {
		t.Errorf("unpublish without storage fencing, with an unreadable %s annotation: %v (code %v)", claims.RetiringAnnotation, err, code(err))
	}
	if c := claimsOf(t, client, id); has(c, "node-a") {
		t.Errorf("node-a's claim stays after its detach: %v", keys(c))
	}
}
