package csi

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// newFakeAPI returns a fake clientset whose PersistentVolume patches and
// updates behave like the API server's optimistic concurrency: a write that
// carries a resourceVersion other than the stored one is a Conflict, and
// every write bumps the resourceVersion. client-go's object tracker does
// neither, and the claims' safety across replicas rests on both.
func newFakeAPI(objs ...runtime.Object) *fake.Clientset {
	return enforceResourceVersions(fake.NewClientset(objs...))
}

// newPlainFakeAPI is newFakeAPI on client-go's plain object tracker,
// without managed fields: an order of magnitude cheaper per write, for
// simulations that make hundreds of thousands of them.
func newPlainFakeAPI(objs ...runtime.Object) *fake.Clientset {
	//nolint:staticcheck // NewSimpleClientset is deprecated for its lack of managed fields, which is what is wanted here.
	return enforceResourceVersions(fake.NewSimpleClientset(objs...))
}

func enforceResourceVersions(client *fake.Clientset) *fake.Clientset {
	var mu sync.Mutex
	rv := int64(1000)
	pvs := corev1.SchemeGroupVersion.WithResource("persistentvolumes")
	client.PrependReactor("patch", "persistentvolumes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		pa := action.(k8stesting.PatchAction)
		if pa.GetPatchType() != types.MergePatchType {
			return false, nil, nil
		}
		obj, err := client.Tracker().Get(pvs, "", pa.GetName())
		if err != nil {
			return true, nil, err
		}
		cur := obj.(*corev1.PersistentVolume)
		var meta struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &meta); err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		if want := meta.Metadata.ResourceVersion; want != "" && want != cur.ResourceVersion {
			return true, nil, apierrors.NewConflict(pvs.GroupResource(), cur.Name, nil)
		}
		orig, err := json.Marshal(cur)
		if err != nil {
			return true, nil, err
		}
		patched, err := jsonpatch.MergePatch(orig, pa.GetPatch())
		if err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		next := &corev1.PersistentVolume{}
		if err := json.Unmarshal(patched, next); err != nil {
			return true, nil, err
		}
		rv++
		next.ResourceVersion = strconv.FormatInt(rv, 10)
		if err := client.Tracker().Update(pvs, next, ""); err != nil {
			return true, nil, err
		}
		return true, next, nil
	})
	return client
}

// publishEnv is one controller replica: the informers' attachment index,
// the storage-fence protocol on the claims, and a ControllerServer serving
// publish on a fake RDS, built as cmd/rds-csi-driver builds them.
type publishEnv struct {
	t *testing.T
	// client is the API server the test reads and writes; own is the
	// client the replica itself calls it through (the same, or a wrapper
	// whose requests the test can hold or fail).
	client *fake.Clientset
	own    *fake.Clientset
	cs     *ControllerServer
	rds    *fakeRDS
	index  *informers.AttachmentIndex
	ctrl   *informers.Controller
	fence  *storagefence.Fence
	live   *fencing.Liveness
	events *record.FakeRecorder
	stop   context.CancelFunc
	done   chan struct{}
	// ctx, when set, is the context publish and unpublish call with (a
	// test that captures the log).
	ctx context.Context
}

func (e *publishEnv) callContext() context.Context {
	if e.ctx != nil {
		return e.ctx
	}
	return context.Background()
}

// envConfig is what a test replica is built with beyond the driver's
// options and the policy.
type envConfig struct {
	// taint: --out-of-service-taint (a NotReady or heartbeat fence taints
	// the node, and its recovery removes the taint).
	taint bool
	// noNodeFencer: the informers run without the node fencer, so that no
	// fence races the publish under test.
	noNodeFencer bool
}

type envOption func(*envConfig)

func withTaint(c *envConfig)         { c.taint = true }
func withoutNodeFencer(c *envConfig) { c.noNodeFencer = true }

// testCatchUp is how long a test replica's publish whose write conflicted
// waits for its own informers to deliver the newer PV. The driver waits
// publishCatchUpLimit (2 s), which a starved -race run can outlast
// (ABORTED where the test expects the decision made again on the newer
// PV); here it is only a safety net. A test whose replica's PV watch is
// held shut sets its CatchUp short.
const testCatchUp = time.Minute

// newPublishEnv starts a replica on client and waits until its informers
// have synced. rdsFake may be shared between replicas.
func newPublishEnv(t *testing.T, client *fake.Clientset, rdsFake *fakeRDS, policy fencing.Config) *publishEnv {
	return newPublishEnvWith(t, client, rdsFake, policy, testOptions())
}

// newPublishEnvWith is newPublishEnv with the driver's options (storage
// fencing and authenticated exports follow from them) and more.
func newPublishEnvWith(t *testing.T, client *fake.Clientset, rdsFake *fakeRDS, policy fencing.Config, opts Options, more ...envOption) *publishEnv {
	t.Helper()
	var cfg envConfig
	for _, o := range more {
		o(&cfg)
	}
	if rdsFake == nil {
		rdsFake = newFakeRDS(1000 * 1 << 30)
	}
	index := informers.NewAttachmentIndex()
	events := record.NewFakeRecorder(100000)
	reporter := fencing.NewReporter(events, nil)
	live := fencing.NewLiveness(fencing.LivenessConfig{Policy: policy, Client: client})
	fence, err := storagefence.New(storagefence.Config{
		StorageFencing: opts.AllowHostFencing(), ExportAuth: opts.ExportAuthOn(), AttachmentKey: opts.AttachmentKey,
		RDS: rdsFake, Store: claims.NewStore(client, DefaultDriverName, opts.AllowHostFencing()), Index: index, Nodes: live,
		IsVolumeID: IsVolumeID, IsVolumeDisk: opts.IsVolumeDisk, Reporter: reporter,
	})
	if err != nil {
		t.Fatal(err)
	}
	icfg := informers.Config{DriverName: DefaultDriverName, Policy: policy, Liveness: live, Malformed: informers.NewMalformedSet(nil)}
	if !cfg.noNodeFencer {
		ncfg := storagefence.NodeFencerConfig{Fence: fence, Nodes: live, Policy: policy, Reporter: reporter}
		if cfg.taint {
			tainter := fencing.NewTainter(client, DefaultDriverName, live)
			ncfg.Tainter = tainter
			icfg.NodeRecovered = tainter.RemoveTaint
		}
		icfg.Reactor = storagefence.NewNodeFencer(ncfg)
	}
	ctrl, err := informers.NewController(client, index, icfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &publishEnv{t: t, client: client, own: client, rds: rdsFake, index: index, ctrl: ctrl, fence: fence, live: live, events: events, stop: cancel, done: make(chan struct{})}
	go func() { ctrl.Run(ctx); close(e.done) }()
	t.Cleanup(e.close)
	if !ctrl.WaitForSync(ctx) {
		t.Fatal("informers never synced")
	}
	e.cs = NewControllerServer(NewDriver(opts, rdsFake), &Publisher{
		Index: index, Fence: fence, Nodes: live, Synced: ctrl.Synced, Policy: policy, Reporter: reporter, Malformed: icfg.Malformed,
		CatchUp: testCatchUp,
	})
	return e
}

func (e *publishEnv) close() {
	e.stop()
	<-e.done
}

// waitFor polls cond until it holds; the informers deliver asynchronously.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, time.Minute, true,
		func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func testPV(name, handle string, mode corev1.PersistentVolumeAccessMode, block bool) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{mode},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: DefaultDriverName, VolumeHandle: handle}},
			ClaimRef: &corev1.ObjectReference{Namespace: "apps", Name: "claim-" + name},
		},
	}
	if block {
		m := corev1.PersistentVolumeBlock
		p.Spec.VolumeMode = &m
	}
	return p
}

func testNode(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(testClock)}}},
	}
}

// testVA is an attached VolumeAttachment of pv to node, named as
// Kubernetes names it (the tests' volume handles are their PV names).
func testVA(pv, node string, created time.Time) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: claims.VolumeAttachmentName(pv, DefaultDriverName, node), CreationTimestamp: metav1.NewTime(created)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: DefaultDriverName, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
}

// claimsOf reads a PV's committed claims from the API.
func claimsOf(t testing.TB, client *fake.Clientset, pv string) map[string]claims.Claim {
	t.Helper()
	p, err := client.CoreV1().PersistentVolumes().Get(context.Background(), pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := claims.DecodeClaims(p)
	if err != nil {
		t.Fatalf("claims of %s: %v", pv, err)
	}
	return m
}

// retiringOf reads a PV's retiring attachments (RetiringAnnotation) from
// the API server.
func retiringOf(t testing.TB, client *fake.Clientset, pv string) []claims.Retiring {
	t.Helper()
	p, err := client.CoreV1().PersistentVolumes().Get(context.Background(), pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := claims.ParseRetiring(p.Annotations[claims.RetiringAnnotation])
	if err != nil {
		t.Fatalf("retiring attachments of %s: %v", pv, err)
	}
	return r
}

// apiHold holds the next request of one verb on one object of a fake API
// server until the test releases it: a replica paused at that read or
// write.
type apiHold struct {
	entered, release chan struct{}
}

// holdAPI holds the next verb request on resource name (any name when
// name is "") that reaches client, until release is closed; later ones
// pass.
func holdAPI(client *fake.Clientset, verb, resource, name string) *apiHold {
	h := &apiHold{entered: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	client.PrependReactor(verb, resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if n, ok := a.(interface{ GetName() string }); ok && name != "" && n.GetName() != name {
			return false, nil, nil
		}
		once.Do(func() {
			close(h.entered)
			<-h.release
		})
		return false, nil, nil
	})
	return h
}

// holdReleaseOfSecondPV holds, on replica client own, the read of PV
// second that follows the write to PV first: a release that reached its
// first PV, paused before its second.
func holdReleaseOfSecondPV(own *fake.Clientset, first, second string) *apiHold {
	h := &apiHold{entered: make(chan struct{}), release: make(chan struct{})}
	var mu sync.Mutex
	wrote, held := false, false
	own.PrependReactor("*", "persistentvolumes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n, ok := a.(interface{ GetName() string })
		if !ok {
			return false, nil, nil
		}
		mu.Lock()
		hold := false
		switch {
		case a.GetVerb() == "patch" && n.GetName() == first:
			wrote = true
		case a.GetVerb() == "get" && n.GetName() == second && wrote && !held:
			held, hold = true, true
		}
		mu.Unlock()
		if hold {
			close(h.entered)
			<-h.release
		}
		return false, nil, nil
	})
	return h
}

// failAPIOnce fails the next verb request on resource name that reaches
// client with err; later ones pass.
func failAPIOnce(client *fake.Clientset, verb, resource, name string, err error) {
	var mu sync.Mutex
	done := false
	client.PrependReactor(verb, resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if n, ok := a.(interface{ GetName() string }); ok && name != "" && n.GetName() != name {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		if done {
			return false, nil, nil
		}
		done = true
		return true, nil, err
	})
}

// fenceNode runs on replica e what the leader's node fencer does for a
// node the index shows stale (out of service) that holds volume id: the
// release of its claim, backed by a live read of the node, through the
// storage-fence protocol. It reports whether the claim went.
func (e *publishEnv) fenceNode(ctx context.Context, id, node string) (bool, error) {
	e.t.Helper()
	v := e.index.Volume(id)
	if !v.Indexed() {
		e.t.Fatalf("volume %s is not in replica's index", id)
	}
	fenced := &fenceReasons{}
	nf := storagefence.NewNodeFencer(storagefence.NodeFencerConfig{Fence: e.fence, Nodes: e.live, Policy: fencing.DefaultConfig(),
		Reporter: fencing.NewReporter(nil, fenced)})
	err := nf.NodeStale(ctx, fencing.StaleHolder{Node: node, Reason: fencing.FenceOutOfService, Volumes: []fencing.VolumeRef{v.Ref()}})
	return len(fenced.reasons) > 0, err
}

// fenceReasons is fencing.Metrics that keeps the fences' reasons.
type fenceReasons struct {
	mu      sync.Mutex
	reasons []fencing.FenceReason
}

func (*fenceReasons) PublishResult(string)          {}
func (*fenceReasons) UnpublishResult(string)        {}
func (*fenceReasons) PublishDecision(time.Duration) {}
func (*fenceReasons) Conflict()                     {}
func (m *fenceReasons) Fenced(reason fencing.FenceReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reasons = append(m.reasons, reason)
}
func (*fenceReasons) OrphanedClaims(int)  {}
func (*fenceReasons) MigrationStarted()   {}
func (*fenceReasons) MigrationFinished()  {}
func (*fenceReasons) MigrationTimedOut()  {}
func (*fenceReasons) ExportMismatch(bool) {}
func (*fenceReasons) GuardHolding(bool)   {}
func (*fenceReasons) NodeFlapped()        {}
