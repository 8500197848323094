package csi

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// The fixtures the controller-side tests share, in one place: the driver's
// options and requests, nodes, replicas on a fake API server and a fake
// RDS (fakeapi_test.go, fakerds_test.go, lagclient_test.go), driving a
// replica as the attacher does, and what a test asserts on. A file of
// tests holds its tests and what only they use.

// Options, capabilities and requests.

const (
	testVolumePath = "/storage-pool/kubernetes-volumes"
	testRDSName    = "rds1"
	testNQNPrefix  = "nqn.2000-02.com.mikrotik:"
	testPVC        = "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	testPVC2       = "pvc-1a1b2c3d-4e5f-6789-abcd-ef0123456789"
	testSnapName   = "snapshot-2a1b2c3d-4e5f-6789-abcd-ef0123456789"
)

var testClock = time.Date(2026, 5, 4, 3, 2, 1, 987654321, time.UTC)

func testOptions() Options {
	o := Options{
		Mode: ModeController, Endpoint: "unix:///tmp/csi-test.sock", DriverName: DefaultDriverName,
		RDSAddress: "10.0.0.5", RDSUser: "csi", RDSKeyFile: "/k", RDSKnownHostsFile: "/kh",
		RDSPool: "storage-pool", VolumePath: testVolumePath, RDSName: testRDSName,
		NVMePort: 4420, NQNPrefix: testNQNPrefix,
		AttachmentKey: []byte("a test attachment key of 32 bytes or more"),
	}
	if err := o.Validate(); err != nil {
		panic(err)
	}
	return o
}

func allowHostOptions() Options {
	o := testOptions()
	o.StorageFencing = StorageFencingAllowHost
	return o
}

func exportAuthOptions() Options {
	o := allowHostOptions()
	o.ExportAuth = ExportAuthDHCHAP
	return o
}

func newTestController(t *testing.T) (*ControllerServer, *fakeRDS) {
	t.Helper()
	f := newFakeRDS(100 * rds.GiB)
	s := NewControllerServer(NewDriver(testOptions(), f), nil)
	s.now = func() time.Time { return testClock }
	return s, f
}

// code is the gRPC code a client would see for err.
func code(err error) codes.Code { return status.Code(toStatus(err)) }

func mustCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if code(err) != want {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode, fs string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
	}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	}
}

const snw = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

func createReq(name string, required int64) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: required},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw, "")},
	}
}

func restoreReq(name, snapshot string) *csi.CreateVolumeRequest {
	r := createReq(name, 0)
	r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapshot}}}
	return r
}

func cloneReq(name, volume string) *csi.CreateVolumeRequest {
	r := createReq(name, 0)
	r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: volume}}}
	return r
}

// Nodes.

const (
	nqnA = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-4000-8000-00000000000a"
	nqnB = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-4000-8000-00000000000b"
	// The node IDs the node plugins register: the node name.
	nodeA = "node-a"
	nodeB = "node-b"
	// The node ID a node plugin from before per-attachment host NQNs
	// registered: the node name and its own host NQN.
	oldPluginA = "node-a/" + nqnA
)

func nodeWithUID(name, uid string) *corev1.Node {
	n := testNode(name)
	n.UID = types.UID(uid)
	return n
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

func taintNode(t *testing.T, client *fake.Clientset, node, key, value string) {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffectNoExecute})
	if _, err := client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func setReady(t *testing.T, client *fake.Clientset, node string, s corev1.ConditionStatus, since time.Time) {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s, LastTransitionTime: metav1.NewTime(since)}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Replicas.

// publishNow is the publisher's clock in these tests; VolumeAttachment
// timestamps are set relative to it.
var publishNow = testClock.Add(time.Hour)

func newFixedPublishEnv(t *testing.T, client *fake.Clientset, rdsFake *fakeRDS, policy fencing.Config) *publishEnv {
	e := newPublishEnv(t, client, rdsFake, policy)
	e.cs.pub.Clock = clocktesting.NewFakePassiveClock(publishNow)
	return e
}

// newFencedEnv is a replica with --storage-fencing=allow-host, wired as
// cmd/rds-csi-driver wires it: fences cut the host off the RDS first, and
// with taint set, a NotReady fence taints the node out of service.
func newFencedEnv(t *testing.T, client *fake.Clientset, policy fencing.Config, taint bool) *publishEnv {
	if taint {
		return newPublishEnvWith(t, client, nil, policy, allowHostOptions(), withTaint)
	}
	return newPublishEnvWith(t, client, nil, policy, allowHostOptions())
}

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

// Driving a replica as the attacher, the leader or a paused replica does.

// newVolume creates a volume on the env's RDS and its PV in the API, and
// waits until the index knows it. It returns the volume ID.
func (e *publishEnv) newVolume(client *fake.Clientset, name string, mode corev1.PersistentVolumeAccessMode, block bool) string {
	e.t.Helper()
	c := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	if block {
		c = blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	}
	resp, err := e.cs.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{c}})
	if err != nil {
		e.t.Fatal(err)
	}
	id := resp.Volume.VolumeId
	if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), testPV(name, id, mode, block), metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	waitFor(e.t, "the index to know "+id, func() bool { return e.index.Volume(id) != nil })
	return id
}

// publish is the attacher's ControllerPublish for a VolumeAttachment of
// id on node: as in Kubernetes, the VolumeAttachment exists first (made
// here, labelled autoVALabel, unless the test made one).
func (e *publishEnv) publish(id, node string, c *csi.VolumeCapability) (*csi.ControllerPublishVolumeResponse, error) {
	e.t.Helper()
	made := e.ensureVA(id, node)
	resp, err := e.cs.ControllerPublishVolume(e.callContext(), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, VolumeCapability: c})
	if err != nil && made {
		// The test asks what the refused or failed publish left; the
		// VolumeAttachment made for it is not part of that.
		e.dropAutoVA(id, node)
	}
	if err == nil {
		e.markAttached(id, node, resp.GetPublishContext())
	}
	return resp, err
}

// unpublish is the attacher's ControllerUnpublish after the detach began:
// a VolumeAttachment publish made is deleted first; one the test made
// stays as the test left it (a late unpublish).
func (e *publishEnv) unpublish(id, node string) error {
	e.t.Helper()
	e.dropAutoVA(id, node)
	_, err := e.cs.ControllerUnpublishVolume(e.callContext(), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: node})
	return err
}

const autoVALabel = "rds-csi-test/auto"

// markAttached records a publish success on its VolumeAttachment as
// external-attacher does: attached, with the answer's publish_context.
func (e *publishEnv) markAttached(id, nodeID string, pc map[string]string) {
	e.t.Helper()
	node := vaNodeName(nodeID)
	if node == "" || e.client == nil {
		return
	}
	name := claims.VolumeAttachmentName(id, DefaultDriverName, node)
	va, err := e.client.StorageV1().VolumeAttachments().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return // the test removed it
	}
	va.Status.Attached, va.Status.AttachmentMetadata = true, pc
	if _, err := e.client.StorageV1().VolumeAttachments().Update(context.Background(), va, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func vaNodeName(nodeID string) string {
	name, _, _ := strings.Cut(nodeID, "/")
	return name
}

func (e *publishEnv) ensureVA(id, nodeID string) (made bool) {
	e.t.Helper()
	node := vaNodeName(nodeID)
	if node == "" || e.client == nil {
		return false
	}
	now := testClock
	if e.cs != nil && e.cs.pub != nil {
		now = e.cs.pub.Clock.Now()
	}
	va := testVA(id, node, now)
	if v := e.index.Volume(id); v.Indexed() {
		// As Kubernetes does: of the PV the claim is bound to.
		pv := v.PVName
		va.Spec.Source.PersistentVolumeName = &pv
	}
	va.Labels = map[string]string{autoVALabel: "true"}
	_, err := e.client.StorageV1().VolumeAttachments().Create(context.Background(), va, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	return err == nil
}

func (e *publishEnv) dropAutoVA(id, nodeID string) {
	e.t.Helper()
	node := vaNodeName(nodeID)
	if node == "" || e.client == nil {
		return
	}
	name := claims.VolumeAttachmentName(id, DefaultDriverName, node)
	va, err := e.client.StorageV1().VolumeAttachments().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil || va.Labels[autoVALabel] != "true" {
		return
	}
	if err := e.client.StorageV1().VolumeAttachments().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	waitFor(e.t, "the index to see the VolumeAttachment gone", func() bool {
		v := e.index.Volume(id)
		if v == nil {
			return true
		}
		for _, a := range v.Attachments {
			if a.VAName == name {
				return false
			}
		}
		return true
	})
}

// putVA creates va, or replaces the one publish made for the test (which
// then stands as the test made it).
func putVA(ctx context.Context, client *fake.Clientset, va *storagev1.VolumeAttachment) (*storagev1.VolumeAttachment, error) {
	got, err := client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return got, err
	}
	cur, err := client.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	va = va.DeepCopy()
	va.ResourceVersion = cur.ResourceVersion
	return client.StorageV1().VolumeAttachments().Update(ctx, va, metav1.UpdateOptions{})
}

// waitClaims waits until the index shows exactly these claims on id.
func (e *publishEnv) waitClaims(id string, nodes ...string) {
	e.t.Helper()
	waitFor(e.t, fmt.Sprintf("claims %v on %s in the index", nodes, id), func() bool {
		v := e.index.Volume(id)
		if v == nil || v.Claims.Len() != len(nodes) {
			return false
		}
		for _, n := range nodes {
			if !v.Claims.Has(n) {
				return false
			}
		}
		return true
	})
}

// waitIndexed waits until this replica's index knows volume id.
func (e *publishEnv) waitIndexed(id string) {
	e.t.Helper()
	waitFor(e.t, "the index to know "+id, func() bool { return e.index.Volume(id).Indexed() })
}

// waitCaughtUp waits until this replica's index holds every PV of volume
// id at the resourceVersion the API server has: its next decision is made
// on the current state, not on one its informers have yet to deliver.
func (e *publishEnv) waitCaughtUp(id string) {
	e.t.Helper()
	waitFor(e.t, "the index to hold the API server's PVs of "+id, func() bool {
		v := e.index.Volume(id)
		if !v.Indexed() {
			return false
		}
		for _, ref := range v.PVs {
			pv, err := e.client.CoreV1().PersistentVolumes().Get(context.Background(), ref.Name, metav1.GetOptions{})
			if err != nil || pv.ResourceVersion != ref.ResourceVersion {
				return false
			}
		}
		return true
	})
}

// drainEvents returns the events recorded so far.
func (e *publishEnv) drainEvents() []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
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

// What a test asserts on.

func (e *publishEnv) disk(id string) rds.Disk {
	e.t.Helper()
	d, ok := e.rds.disk(id)
	if !ok {
		e.t.Fatalf("no disk %s", id)
	}
	return d
}

func (e *publishEnv) drops(id string) int {
	e.rds.mu.Lock()
	defer e.rds.mu.Unlock()
	return e.rds.drops[id]
}

// hostOf is the host NQN of node's attachment of id, from its live claim.
func (e *publishEnv) hostOf(id, node string) string {
	e.t.Helper()
	c, ok := claimsOf(e.t, e.client, id)[node]
	if !ok {
		e.t.Fatalf("volume %s: node %s holds no claim", id, node)
	}
	return e.fence.HostOf(id, node, c)
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

// wantClosed: the export is closed (its host is a tombstone, whatever it is).
func wantClosed(t *testing.T, e *publishEnv, id string) {
	t.Helper()
	if d := e.disk(id); d.Exported {
		t.Fatalf("volume %s: exported to %q; want closed", id, d.AllowHost)
	}
}

// The export a test expects: closed, or open to one host ("" any).
func wantExport(t *testing.T, e *publishEnv, id string, open bool, host string) {
	t.Helper()
	d := e.disk(id)
	if d.Exported != open || (open && d.AllowHost != host) {
		t.Fatalf("volume %s: exported=%t allow-host=%q; want exported=%t allow-host=%q", id, d.Exported, d.AllowHost, open, host)
	}
}

func exportOpen(host string) rds.ExportState { return rds.ExportState{Open: true, Host: host} }

func exportClosed() rds.ExportState {
	return rds.ExportState{Host: "nqn.2014-08.org.nvmexpress:uuid:00000000-dead-4000-8000-000000000000"}
}

func hasEvent(events []string, substrings ...string) bool {
	for _, ev := range events {
		all := true
		for _, s := range substrings {
			all = all && strings.Contains(ev, s)
		}
		if all {
			return true
		}
	}
	return false
}

func has[V any](m map[string]V, k string) bool {
	_, ok := m[k]
	return ok
}

// claimOn is node's claim in cs, or none.
func claimOn(cs claims.Set, node string) claims.Claim {
	c, _ := cs.Get(node)
	return c
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// indexedPVs counts the PersistentVolumes the index has for a handle.
func indexedPVs(v *informers.Volume) int {
	if v == nil {
		return 0
	}
	return len(v.PVs)
}
