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

	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
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
// the claims, and a ControllerServer serving publish on a fake RDS.
type publishEnv struct {
	t      *testing.T
	client *fake.Clientset
	cs     *ControllerServer
	rds    *fakeRDS
	index  *informers.AttachmentIndex
	ctrl   *informers.Controller
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

// newPublishEnv starts a replica on client and waits until its informers
// have synced. rdsFake may be shared between replicas.
func newPublishEnv(t *testing.T, client *fake.Clientset, rdsFake *fakeRDS, policy fencing.Config) *publishEnv {
	return newPublishEnvWith(t, client, rdsFake, policy, testOptions(), nil)
}

// newPublishEnvWith is newPublishEnv with the driver's options and a hook
// that wires what cmd/rds-csi-driver wires for them, before the informers
// start.
func newPublishEnvWith(t *testing.T, client *fake.Clientset, rdsFake *fakeRDS, policy fencing.Config, opts Options,
	wire func(cs *ControllerServer, claims *informers.Claims, fencer *fencing.Fencer, cfg *informers.Config)) *publishEnv {
	t.Helper()
	if rdsFake == nil {
		rdsFake = newFakeRDS(1000 * 1 << 30)
	}
	index := informers.NewAttachmentIndex()
	events := record.NewFakeRecorder(100000)
	reporter := fencing.NewReporter(events, nil)
	claims := informers.NewClaims(client, DefaultDriverName)
	fencer := fencing.NewFencer(claims, reporter, nil, policy, nil)
	cs := NewControllerServer(NewDriver(opts, rdsFake))
	cfg := informers.Config{DriverName: DefaultDriverName, Policy: policy, Reactor: fencer, Malformed: informers.NewMalformedSet(nil)}
	if wire != nil {
		wire(cs, claims, fencer, &cfg)
	}
	ctrl, err := informers.NewController(client, index, cfg)
	if err != nil {
		t.Fatal(err)
	}
	claims.TimeWith(ctrl.Liveness())
	ctx, cancel := context.WithCancel(context.Background())
	e := &publishEnv{t: t, client: client, rds: rdsFake, index: index, ctrl: ctrl, events: events, stop: cancel, done: make(chan struct{})}
	go func() { ctrl.Run(ctx); close(e.done) }()
	t.Cleanup(e.close)
	if !ctrl.WaitForSync(ctx) {
		t.Fatal("informers never synced")
	}
	e.cs = cs.ServePublish(&Publisher{
		Index: index, Claims: claims, Synced: ctrl.Synced, Policy: policy, Reporter: reporter, Malformed: cfg.Malformed,
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
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 30*time.Second, true,
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
		ObjectMeta: metav1.ObjectMeta{Name: informers.VolumeAttachmentName(pv, DefaultDriverName, node), CreationTimestamp: metav1.NewTime(created)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: DefaultDriverName, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
}

// claimsOf reads a PV's committed claims from the API.
func claimsOf(t testing.TB, client *fake.Clientset, pv string) map[string]informers.Claim {
	t.Helper()
	p, err := client.CoreV1().PersistentVolumes().Get(context.Background(), pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := informers.DecodeClaims(p)
	if err != nil {
		t.Fatalf("claims of %s: %v", pv, err)
	}
	return m
}

// retiringOf reads a PV's retiring attachments (RetiringAnnotation) from
// the API server.
func retiringOf(t testing.TB, client *fake.Clientset, pv string) []informers.Retiring {
	t.Helper()
	p, err := client.CoreV1().PersistentVolumes().Get(context.Background(), pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := informers.ParseRetiring(p.Annotations[informers.RetiringAnnotation])
	if err != nil {
		t.Fatalf("retiring attachments of %s: %v", pv, err)
	}
	return r
}
