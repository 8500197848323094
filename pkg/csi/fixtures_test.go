package csi

import (
	"context"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// The fixtures the controller-side tests share: replicas on a fake API
// server and a fake RDS (fakeapi_test.go, fakerds_test.go), and the
// scenarios built on them. A test file holds tests; what more than one of
// them needs lives here.

// newTwoFencedReplicas: two replicas with storage fencing share one API
// server and one RDS; a held SwapExport lands late, after the other
// replica moved on, exactly as a slow RouterOS command.
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

// waitIndexed waits until this replica's index knows volume id.
func (e *publishEnv) waitIndexed(id string) {
	e.t.Helper()
	waitFor(e.t, "the index to know "+id, func() bool { return e.index.Volume(id).Indexed() })
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

// newTwoReplicasFencedByHand: two fenced replicas on one API server and
// one RDS, without the informer-driven fencer (a test runs a fence
// itself, at the moment it chooses).
func newTwoReplicasFencedByHand(t *testing.T, nodes ...*corev1.Node) (*publishEnv, *publishEnv, *fake.Clientset) {
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

// twoPVVolume makes a volume whose handle has two PVs (a Retained PV
// re-created under a new name), known to both replicas, and publishes it
// to node-a through replica a: the claim is on both PVs. It returns the
// handle and the PVs in the order replica a's index lists them.
func twoPVVolume(t *testing.T, a, b *publishEnv, client *fake.Clientset, name string) (string, []string) {
	t.Helper()
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, name, corev1.ReadWriteOnce, false)
	if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), testPV(name+"-recreated", id, corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both replicas to know both PVs", func() bool {
		return indexedPVs(a.index.Volume(id)) == 2 && indexedPVs(b.index.Volume(id)) == 2
	})
	if _, err := a.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	var pvs []string
	for _, pv := range a.index.Volume(id).PVs {
		pvs = append(pvs, pv.Name)
	}
	for _, pv := range pvs {
		if !has(claimsOf(t, client, pv), "node-a") {
			t.Fatalf("scripting: node-a's claim should be on both PVs; %s has %v", pv, keys(claimsOf(t, client, pv)))
		}
	}
	return id, pvs
}

// releaseAndStop does on replica e what an unpublish of node-a does up
// to its release (the cut, then the release with its record) and stops
// there, as a replica that dies before the export change after it: its
// context ends as the release's write goes out.
func releaseAndStop(t *testing.T, e *publishEnv, id string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	e.own.PrependReactor("patch", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(cancel) // the write goes on; no step after it does
		return false, nil, nil
	})
	if released, err := e.cs.unpublishFrom(ctx, e.index.Volume(id), "node-a"); err != nil || !released {
		t.Fatalf("scripting: the release of node-a's claim: %t, %v", released, err)
	}
}

// recreateNodeA deletes node-a and creates it again as incarnation uid-2,
// and waits until both replicas' indexes see it.
func recreateNodeA(t *testing.T, client *fake.Clientset, a, b *publishEnv) {
	t.Helper()
	ctx := context.Background()
	if err := client.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, nodeWithUID("node-a", "uid-2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both indexes to see node-a's new incarnation", func() bool {
		return a.index.Node("node-a").UID == "uid-2" && b.index.Node("node-a").UID == "uid-2"
	})
}

// hostOn is the host NQN of node's attachment as pv records it.
func hostOn(t *testing.T, e *publishEnv, client *fake.Clientset, id, pv, node string) string {
	t.Helper()
	c, ok := claimsOf(t, client, pv)[node]
	if !ok {
		t.Fatalf("PV %s: node %s holds no claim", pv, node)
	}
	return e.fence.HostOf(id, node, c)
}

// unpublishFailingOn unpublishes id from node-a on e with the first PATCH
// of PV pv failing (an API error): the release reaches the handle's other
// PV, not pv, and the unpublish fails (the attacher retries it later).
func unpublishFailingOn(t *testing.T, e *publishEnv, client *fake.Clientset, id, pv string) {
	t.Helper()
	failed := false
	client.PrependReactor("patch", "persistentvolumes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.(k8stesting.PatchAction).GetName() != pv || failed {
			return false, nil, nil
		}
		failed = true
		return true, nil, apierrors.NewInternalError(context.DeadlineExceeded)
	})
	if err := e.unpublish(id, nodeA); err == nil || !failed {
		t.Fatalf("scripting: the unpublish should fail on PV %s: %v", pv, err)
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

// enteredBeforeAnswer waits until the held call h arrives or the call
// answered on answered does first (then h is disarmed, and the answer's
// error fails the test). It reports whether h arrived.
func enteredBeforeAnswer(t *testing.T, h *hold, answered chan error, what string) bool {
	t.Helper()
	select {
	case <-h.entered:
		return true
	case err := <-answered:
		close(h.release) // disarmed: a later call passes through
		if err != nil && status.Code(err) != codes.Aborted {
			// ABORTED: the older holder of a migration is refused while
			// the export allows the newer.
			t.Fatalf("%s: %v", what, err)
		}
		return false
	}
}
