package informers

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/srvlab/rds-csi/pkg/nodelease"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

const driver = "rds.csi.srvlab.io"

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func pv(name, handle string, mode corev1.PersistentVolumeAccessMode, held string) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Annotations: map[string]string{"other": "x"}},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes:            []corev1.PersistentVolumeAccessMode{mode},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
			ClaimRef:               &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "claim-" + name},
		},
	}
	if held != "" {
		p.Annotations[claims.ClaimsAnnotation] = held
	}
	return p
}

func va(name, pvName, node string, attached bool, created time.Time) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		Status: storagev1.VolumeAttachmentStatus{Attached: attached},
	}
}

func node(name string, ready bool, since time.Time, taints ...corev1.Taint) *corev1.Node {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(since)}},
			Images:     []corev1.ContainerImage{{Names: []string{"big-image"}}},
		},
	}
}

type recorder struct {
	stale    []fencing.StaleHolder
	overdue  []fencing.Migration
	orphaned []string // handle/node
}

func (r *recorder) MigrationTimedOut(_ context.Context, _ fencing.VolumeRef, m fencing.Migration) error {
	r.overdue = append(r.overdue, m)
	return nil
}

func (r *recorder) NodeStale(_ context.Context, s fencing.StaleHolder) error {
	r.stale = append(r.stale, s)
	return nil
}

func (r *recorder) OrphanedClaim(_ context.Context, v fencing.VolumeRef, node string, _ time.Duration) error {
	r.orphaned = append(r.orphaned, v.Handle+"/"+node)
	return nil
}

// harness feeds the controller's stores directly and drains its queues in
// the test's goroutine, like sample-controller's tests: deterministic, no
// goroutines of the controller's own.
type harness struct {
	t     *testing.T
	c     *Controller
	feed  *Feed
	index *AttachmentIndex
	react *recorder
	clock *clocktesting.FakeClock
}

func newHarness(t *testing.T, policy fencing.Config) *harness {
	return newHarnessWith(t, Config{Policy: policy})
}

func newHarnessWith(t *testing.T, cfg Config) *harness {
	return newHarnessLive(t, cfg, fencing.LivenessConfig{})
}

// newHarnessLive is newHarnessWith whose controller times node health with
// a Liveness of lc, on the harness's clock and cfg's policy.
func newHarnessLive(t *testing.T, cfg Config, lc fencing.LivenessConfig) *harness {
	h := &harness{t: t, index: NewAttachmentIndex(), react: &recorder{}, clock: clocktesting.NewFakeClock(t0.Add(time.Hour))}
	cfg.DriverName, cfg.Reactor, cfg.Clock = driver, h.react, h.clock
	lc.Clock, lc.Policy = h.clock, cfg.Policy
	cfg.Liveness = fencing.NewLiveness(lc)
	h.c, h.feed = NewFedController(h.index, cfg)
	return h
}

func (h *harness) put(objs ...runtime.Object) {
	h.t.Helper()
	for _, o := range objs {
		if err := h.feed.Apply(o); err != nil {
			h.t.Fatal(err)
		}
		h.c.Drain(context.Background())
	}
}

func (h *harness) remove(o runtime.Object) {
	h.t.Helper()
	if err := h.feed.Remove(o); err != nil {
		h.t.Fatal(err)
	}
	h.c.Drain(context.Background())
}

// next waits for the item a queue receives when the fake clock passes its
// time, and processes it with whatever it queues.
func (h *harness) next(q workqueue.TypedRateLimitingInterface[key]) key {
	h.t.Helper()
	k, _ := q.Get()
	q.Done(k)
	q.Add(k)
	h.c.Drain(context.Background())
	return k
}

func TestIndexFollowsObjects(t *testing.T) {
	h := newHarness(t, fencing.DefaultConfig())
	// A VA may arrive before its PV.
	h.put(va("va-1", "pv-1", "node-a", true, t0))
	if h.index.Volume("vol-1") != nil {
		t.Fatal("volume known before its PV")
	}
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T11:00:00Z"}`))
	v := h.index.Volume("vol-1")
	if v == nil || v.PVName != "pv-1" || len(v.Attachments) != 1 || !v.Attachments[0].Attached || v.Attachments[0].Node != "node-a" {
		t.Fatalf("entry %+v", v)
	}
	if got := claimOn(v.Claims, "node-a").At; !got.Equal(t0.Add(-time.Hour)) {
		t.Errorf("claim time %v", got)
	}
	holders := v.Holders()
	if len(holders) != 1 || holders[0].Node != "node-a" || !holders[0].Since.Equal(t0.Add(-time.Hour)) {
		t.Errorf("holders %+v", holders)
	}
	// Entries handed out never change.
	h.put(va("va-2", "pv-1", "node-b", false, t0.Add(time.Minute)))
	if len(v.Attachments) != 1 {
		t.Fatal("a reader's entry was modified in place")
	}
	if got := h.index.Volume("vol-1"); len(got.Attachments) != 2 {
		t.Fatalf("second attachment missing: %+v", got)
	}
	// Deleting a VA removes only that attachment.
	h.remove(va("va-1", "pv-1", "node-a", true, t0))
	if got := h.index.Volume("vol-1"); len(got.Attachments) != 1 || got.Attachments[0].Node != "node-b" || got.Attachments[0].VAName != "va-2" {
		t.Fatalf("after VA delete: %+v", got)
	}
	// Other drivers' objects never count.
	other := va("va-x", "pv-1", "node-c", true, t0)
	other.Spec.Attacher = "other.csi"
	h.put(other)
	foreign := pv("pv-x", "vol-x", corev1.ReadWriteOnce, "")
	foreign.Spec.CSI.Driver = "other.csi"
	h.put(foreign)
	if h.index.Volume("vol-x") != nil || len(h.index.Volume("vol-1").Attachments) != 1 {
		t.Fatal("foreign objects entered the index")
	}
	if s := h.index.Stats(); s.Volumes != 1 || s.Attachments != 1 {
		t.Errorf("stats %+v", s)
	}
	// The PV goes; the VolumeAttachment that still stands keeps counting
	// for the handle (another PV of it may come or exist), without PV data.
	h.remove(pv("pv-1", "vol-1", corev1.ReadWriteOnce, ""))
	if v := h.index.Volume("vol-1"); v.Indexed() || len(v.Attachments) != 1 {
		t.Fatalf("after the PV's deletion: %+v", v)
	}
	h.remove(va("va-2", "pv-1", "node-b", false, t0.Add(time.Minute)))
	if v := h.index.Volume("vol-1"); v != nil {
		t.Fatalf("nothing of vol-1 is left, yet: %+v", v)
	}
}

func TestDetachingVA(t *testing.T) {
	h := newHarness(t, fencing.DefaultConfig())
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, ""))
	deleting := va("va-1", "pv-1", "node-a", true, t0)
	deleting.DeletionTimestamp = &metav1.Time{Time: t0.Add(time.Minute)}
	h.put(deleting)
	hs := h.index.Volume("vol-1").Holders()
	if len(hs) != 1 || !hs[0].DetachingSince.Equal(t0.Add(time.Minute)) {
		t.Fatalf("holders %+v", hs)
	}
	// Being deleted does not end the hold: a claimed or still-attached
	// node holds until its detach completes (fencing.Decide refuses
	// others meanwhile); only attached=false without a claim ends it.
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`))
	if hs := h.index.Volume("vol-1").Holders(); len(hs) != 1 {
		t.Fatalf("claimed, detaching holder: %+v", hs)
	}
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, ""))
	detached := deleting.DeepCopy()
	detached.Status.Attached = false
	h.put(detached)
	if hs := h.index.Volume("vol-1").Holders(); len(hs) != 0 {
		t.Fatalf("a completed detach still holds: %+v", hs)
	}
}

func TestCorruptClaimsKeepPreviousState(t *testing.T) {
	h := newHarness(t, fencing.DefaultConfig())
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`))
	bad := pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{not json`)
	bad.ResourceVersion = "2"
	h.put(bad)
	if v := h.index.Volume("vol-1"); v.Claims.Len() != 1 {
		t.Fatalf("a corrupt annotation freed the volume: %+v", v)
	}
}

func TestNodeFailureReactions(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.NotReadyThreshold = time.Minute
	h := newHarness(t, policy)
	h.put(node("node-a", true, t0), node("node-b", true, t0))
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, ""), va("va-1", "pv-1", "node-a", true, t0))
	h.put(pv("pv-2", "vol-2", corev1.ReadWriteOnce, `{"node-b":"2026-11-22T12:00:00Z"}`))
	if len(h.react.stale) != 0 {
		t.Fatalf("healthy nodes reported stale: %+v", h.react.stale)
	}

	// Out-of-service taint: reported at once, with the node's volumes.
	h.put(node("node-a", false, t0, corev1.Taint{Key: fencing.OutOfServiceTaint, Effect: corev1.TaintEffectNoExecute}))
	if len(h.react.stale) != 1 || h.react.stale[0].Reason != fencing.FenceOutOfService || len(h.react.stale[0].Volumes) != 1 || h.react.stale[0].Volumes[0].Handle != "vol-1" {
		t.Fatalf("out-of-service reaction: %+v", h.react.stale)
	}
	// The same state again is not a new failure.
	h.put(node("node-a", false, t0, corev1.Taint{Key: fencing.OutOfServiceTaint, Effect: corev1.TaintEffectNoExecute}))
	if len(h.react.stale) != 1 {
		t.Fatalf("repeated reaction: %d", len(h.react.stale))
	}

	// Deletion of a node holding a claimed volume.
	h.remove(node("node-b", true, t0))
	if len(h.react.stale) != 2 || h.react.stale[1].Reason != fencing.FenceNodeDeleted || h.react.stale[1].Volumes[0].Handle != "vol-2" {
		t.Fatalf("deletion reaction: %+v", h.react.stale)
	}
	if h.index.Node("node-b").Exists {
		t.Fatal("deleted node still exists in the index")
	}

	// NotReady: not stale before the threshold; the controller schedules
	// itself for the moment it passes.
	h.put(node("node-c", true, t0), va("va-3", "pv-2", "node-c", true, t0))
	h.put(node("node-c", false, h.clock.Now()))
	if len(h.react.stale) != 2 {
		t.Fatalf("NotReady reported before the threshold: %+v", h.react.stale)
	}
	if h.c.queueLen() != 0 {
		t.Fatal("follow-up enqueued immediately instead of after the threshold")
	}
	h.clock.Step(time.Minute + 2*time.Millisecond)
	if k := h.next(h.c.queue); k != (key{kindNode, "node-c"}) {
		t.Fatalf("queued %v", k)
	}
	if len(h.react.stale) != 3 || h.react.stale[2].Reason != fencing.FenceNotReady {
		t.Fatalf("NotReady reaction: %+v", h.react.stale)
	}
}

// The caches hold records of what the syncs read: the key functions of
// the informers and their stores work on them, the transform is
// idempotent, and what repeats is stored once.
func TestRecordsKeepWhatTheSyncsRead(t *testing.T) {
	m := newRecordMaker(driver)
	n := node("n", false, t0, corev1.Taint{Key: fencing.OutOfServiceTaint, Value: fencing.DriverOutOfServiceValue})
	n.UID = "u-n"
	rec, _ := m.record(n)
	nr := rec.(*nodeRecord)
	if want := (NodeState{Exists: true, UID: "u-n", NotReadySince: t0, OutOfService: true}); nr.state != want || !nr.driverTaint {
		t.Errorf("node record %+v; want state %+v and the driver's taint", nr, want)
	}
	p := pv("p", "h", corev1.ReadWriteOnce, `{"a":"2026-11-22T12:00:00Z"}`)
	p.Annotations[claims.RetiringAnnotation] = "[]"
	p.Status.Phase = corev1.VolumeBound
	p.CreationTimestamp = metav1.NewTime(t0)
	block := corev1.PersistentVolumeBlock
	p.Spec.VolumeMode = &block
	rec, _ = m.record(p)
	pr := rec.(*pvRecord)
	if pr.foreign || pr.handle != "h" || pr.claims != p.Annotations[claims.ClaimsAnnotation] || pr.retiring != "[]" || !pr.block || !pr.bound ||
		!pr.created.Equal(t0) || pr.resourceVersion != "1" || *pr.claimRef != *p.Spec.ClaimRef || len(pr.accessModes) != 1 {
		t.Errorf("PV record %+v", pr)
	}
	if again, _ := m.record(pr); again != any(pr) {
		t.Error("the transform is not idempotent on a record")
	}
	other := pv("q", "h2", corev1.ReadWriteOnce, "")
	other.Spec.CSI.Driver = "other.csi"
	if rec, _ := m.record(other); !rec.(*pvRecord).foreign || rec.(*pvRecord).handle != "" {
		t.Errorf("another driver's PV: %+v", rec)
	}
	a, _ := m.record(va("va-1", "p", "node-a", true, t0))
	b, _ := m.record(va("va-2", "q", "node-a", false, t0))
	if a.(*vaRecord).node != b.(*vaRecord).node || unsafe.StringData(a.(*vaRecord).node.Value()) != unsafe.StringData(b.(*vaRecord).node.Value()) {
		t.Error("a node name is stored once per VolumeAttachment, not once")
	}
	if q, _ := m.record(pv("r", "h3", corev1.ReadWriteOnce, "")); &q.(*pvRecord).accessModes[0] != &pr.accessModes[0] {
		t.Error("an access-mode list is stored once per PV, not once")
	}
	// What the informers and their stores key records by.
	for _, obj := range []any{nr, pr, a, &leaseRecord{name: "l", namespace: fencing.NodeLeaseNamespace}} {
		want, err := cache.MetaNamespaceKeyFunc(obj)
		if err != nil || want == "" {
			t.Fatalf("no key for %T: %v", obj, err)
		}
		if got, err := cache.DeletionHandlingMetaNamespaceKeyFunc(cache.DeletedFinalStateUnknown{Key: want, Obj: obj}); got != want || err != nil {
			t.Errorf("tombstone of %T keyed %q, %v", obj, got, err)
		}
	}
}

// TestRunSyncsAndReportsReady runs the real informers against a fake API.
func TestRunSyncsAndReportsReady(t *testing.T) {
	client := fake.NewClientset(pv("pv-1", "vol-1", corev1.ReadWriteOnce, ""), va("va-1", "pv-1", "node-a", true, t0), node("node-a", true, t0))
	index := NewAttachmentIndex()
	c, err := NewController(client, index, Config{DriverName: driver, Policy: fencing.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	if c.Synced() {
		t.Fatal("synced before start")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	if !c.WaitForSync(ctx) || !c.Synced() {
		t.Fatal("never synced")
	}
	// Ready means indexed: what the API held at start-up is in the index
	// the moment Synced is true, with no extra wait.
	v := index.Volume("vol-1")
	if v == nil || len(v.Attachments) != 1 || !index.Node("node-a").Exists {
		t.Fatalf("synced, but the index lacks the start-up objects: %+v", v)
	}
	cancel()
	<-done
}

// queueAdds counts what is added to the index's work queue.
type queueAdds struct{ n atomic.Int64 }

type addCounter struct{ n *atomic.Int64 }

func (a addCounter) Inc() { a.n.Add(1) }

type noMetric struct{}

func (noMetric) Inc()            {}
func (noMetric) Dec()            {}
func (noMetric) Set(float64)     {}
func (noMetric) Observe(float64) {}

func (q *queueAdds) NewDepthMetric(string) workqueue.GaugeMetric { return noMetric{} }
func (q *queueAdds) NewAddsMetric(name string) workqueue.CounterMetric {
	return addCounter{&q.n}
}
func (q *queueAdds) NewLatencyMetric(string) workqueue.HistogramMetric      { return noMetric{} }
func (q *queueAdds) NewWorkDurationMetric(string) workqueue.HistogramMetric { return noMetric{} }
func (q *queueAdds) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noMetric{}
}
func (q *queueAdds) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noMetric{}
}
func (q *queueAdds) NewRetriesMetric(string) workqueue.CounterMetric { return noMetric{} }

// startCounted runs a controller on client until the test ends, with its
// work queue's adds counted, and returns once it has synced.
func startCounted(t *testing.T, client *fake.Clientset) (*AttachmentIndex, *queueAdds, context.Context) {
	t.Helper()
	adds := &queueAdds{}
	index := NewAttachmentIndex()
	c, err := NewController(client, index, Config{DriverName: driver, Policy: fencing.DefaultConfig(), queueMetrics: adds})
	if err != nil {
		t.Fatal(err)
	}
	return index, adds, runSynced(t, c)
}

// TestStartupListBypassesTheQueue: what the informers list at start-up is
// indexed from their caches, not through the work queue, whose sets would
// keep a key's worth of memory per listed object for good; the index is
// complete when it reports synced all the same.
func TestStartupListBypassesTheQueue(t *testing.T) {
	var objs []runtime.Object
	for i := 0; i < 50; i++ {
		objs = append(objs, pv(fmt.Sprintf("pv-%d", i), fmt.Sprintf("vol-%d", i), corev1.ReadWriteOnce, ""),
			va(fmt.Sprintf("va-%d", i), fmt.Sprintf("pv-%d", i), fmt.Sprintf("node-%d", i%5), true, t0))
	}
	for i := 0; i < 5; i++ {
		objs = append(objs, node(fmt.Sprintf("node-%d", i), true, t0))
	}
	index, adds, _ := startCounted(t, fake.NewClientset(objs...))
	if s := index.Stats(); s != (Stats{Volumes: 50, Attachments: 50, Nodes: 5}) {
		t.Fatalf("synced with %+v in the index", s)
	}
	if v := index.Volume("vol-7"); v == nil || !v.Indexed() || len(v.Attachments) != 1 || !index.Node("node-2").Exists {
		t.Fatalf("vol-7 indexed as %+v", v)
	}
	if n := adds.n.Load(); n != 0 {
		t.Errorf("the start-up list went through the work queue: %d adds for 105 listed objects", n)
	}
}

// TestRefenceStaleAfterFailover: a replica that was not leader when a node
// failed has marked the failure as seen; on becoming leader it queues the
// reaction again, so the claim is released after all.
func TestRefenceStaleAfterFailover(t *testing.T) {
	h := newHarness(t, fencing.DefaultConfig())
	h.put(node("node-b", true, t0))
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-gone":"2026-11-22T12:00:00Z"}`))
	h.put(pv("pv-2", "vol-2", corev1.ReadWriteOnce, `{"node-b":"2026-11-22T12:00:00Z"}`))
	if len(h.react.stale) != 0 {
		t.Fatalf("reacted without a node event: %+v", h.react.stale)
	}
	h.c.RefenceStale()
	h.c.Drain(context.Background())
	if len(h.react.stale) != 1 || h.react.stale[0].Node != "node-gone" || h.react.stale[0].Volumes[0].Handle != "vol-1" {
		t.Fatalf("reactions after RefenceStale: %+v", h.react.stale)
	}
}

// TestPendingAttachmentIsNotAHolder: a VolumeAttachment that never
// attached (a refused request) holds nothing unless a claim says so.
func TestPendingAttachmentIsNotAHolder(t *testing.T) {
	h := newHarness(t, fencing.DefaultConfig())
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`))
	h.put(va("va-a", "pv-1", "node-a", false, t0), va("va-b", "pv-1", "node-b", false, t0), va("va-c", "pv-1", "node-c", true, t0))
	var nodes []string
	for _, ho := range h.index.Volume("vol-1").Holders() {
		nodes = append(nodes, ho.Node)
	}
	if fmt.Sprint(nodes) != "[node-a node-c]" {
		t.Fatalf("holders %v, want the claimed node-a and the attached node-c", nodes)
	}
}

// TestOverdueMigrationReported: a raw-block RWX volume still on two nodes
// when the migration timeout passes is reported once, at that moment,
// without a publish to trigger it; a finished migration is not.
func TestOverdueMigrationReported(t *testing.T) {
	policy := fencing.DefaultConfig()
	policy.MigrationTimeout = 5 * time.Minute
	h := newHarness(t, policy)
	now := h.clock.Now()
	h.put(node("node-a", true, t0), node("node-b", true, t0))
	rwx := pv("pv-1", "vol-1", corev1.ReadWriteMany, "")
	block := corev1.PersistentVolumeBlock
	rwx.Spec.VolumeMode = &block
	h.put(rwx, va("va-a", "pv-1", "node-a", true, now.Add(-time.Hour)), va("va-b", "pv-1", "node-b", true, now.Add(-time.Minute)))
	if len(h.react.overdue) != 0 {
		t.Fatalf("reported before the timeout: %+v", h.react.overdue)
	}
	// The controller queued itself for the deadline: 4 minutes from now.
	h.clock.Step(4*time.Minute + 2*time.Millisecond)
	if k := h.next(h.c.reactions); k != (key{kindMigration, "pv-1"}) {
		t.Fatalf("queued %v, want the migration check", k)
	}
	if len(h.react.overdue) != 1 || h.react.overdue[0].Source != "node-a" || h.react.overdue[0].Target != "node-b" {
		t.Fatalf("overdue reports: %+v", h.react.overdue)
	}
	// Unrelated updates do not report it again; the end of the migration
	// clears it.
	h.put(rwx)
	if len(h.react.overdue) != 1 {
		t.Fatalf("reported again: %+v", h.react.overdue)
	}
	h.remove(va("va-a", "pv-1", "node-a", true, now.Add(-time.Hour)))
	if _, ok := h.c.overdue["pv-1"]; ok {
		t.Fatal("a finished migration is still marked overdue")
	}
}

// TestWaitForChange: a reader waiting on an entry read at one
// resourceVersion wakes when the worker indexes a later one, and returns
// at once when the index is already past it.
func TestWaitForChange(t *testing.T) {
	h := newHarness(t, fencing.DefaultConfig())
	h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, ""))
	got := make(chan *Volume)
	first := h.index.Volume("vol-1").Version()
	go func() { got <- h.index.WaitForChange(context.Background(), "vol-1", first) }()
	next := pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`)
	next.ResourceVersion = "2"
	h.put(next)
	if v := <-got; v.ResourceVersion != "2" || !v.HasClaim("node-a") {
		t.Fatalf("woke with %+v", v)
	}
	if v := h.index.WaitForChange(context.Background(), "vol-1", first); v.ResourceVersion != "2" {
		t.Fatalf("did not return at once: %+v", v)
	}
}

// The index built from the compact records holds, for every field a
// decision reads, what the API objects say: variations of each field go
// through the Feed (as through the informers) and the entries are
// compared with the objects themselves.
func TestIndexFromRecordsMatchesTheObjects(t *testing.T) {
	block, fs := corev1.PersistentVolumeBlock, corev1.PersistentVolumeFilesystem
	deleting := metav1.NewTime(t0.Add(time.Minute))
	rwx := pv("pv-rwx", "vol-rwx", corev1.ReadWriteMany, `{"node-a":{"at":"2026-11-22T12:00:00Z","uid":"u-a","cap":"block/MULTI_NODE_MULTI_WRITER","gen":3,"n":"nonce"}}`)
	rwx.Spec.VolumeMode, rwx.Status.Phase = &block, corev1.VolumeBound
	rwx.Spec.AccessModes = append(rwx.Spec.AccessModes, corev1.ReadOnlyMany)
	rwx.Annotations[claims.RetiringAnnotation] = `[{"node":"node-b","n":"old","at":"2026-11-22T11:00:00Z"}]`
	rwo := pv("pv-rwo", "vol-rwo", corev1.ReadWriteOncePod, "")
	rwo.Spec.VolumeMode, rwo.Status.Phase, rwo.ResourceVersion = &fs, corev1.VolumeReleased, "7"
	unbound := pv("pv-unbound", "vol-unbound", corev1.ReadWriteOnce, "")
	unbound.Spec.ClaimRef = nil
	foreign := pv("pv-foreign", "vol-foreign", corev1.ReadWriteOnce, "")
	foreign.Spec.CSI.Driver = "other.csi"
	noCSI := pv("pv-nocsi", "vol-nocsi", corev1.ReadWriteOnce, "")
	noCSI.Spec.CSI = nil
	pvs := []*corev1.PersistentVolume{rwx, rwo, unbound, foreign, noCSI}

	detaching := va("va-det", "pv-rwx", "node-b", true, t0.Add(time.Second))
	detaching.DeletionTimestamp = &deleting
	otherAttacher := va("va-other", "pv-rwo", "node-c", true, t0)
	otherAttacher.Spec.Attacher = "other.csi"
	inline := va("va-inline", "", "node-c", true, t0)
	inline.Spec.Source.PersistentVolumeName = nil
	vas := []*storagev1.VolumeAttachment{va("va-a", "pv-rwx", "node-a", true, t0), detaching, va("va-req", "pv-rwo", "node-a", false, t0.Add(2*time.Second)), otherAttacher, inline}

	nodes := []*corev1.Node{
		node("node-a", true, t0),
		node("node-b", false, t0.Add(-time.Hour), corev1.Taint{Key: fencing.OutOfServiceTaint, Value: "other", Effect: corev1.TaintEffectNoExecute}),
		node("node-c", true, t0, corev1.Taint{Key: fencing.OutOfServiceTaint, Value: fencing.DriverOutOfServiceValue, Effect: corev1.TaintEffectNoExecute}),
	}
	nodes[0].UID, nodes[1].UID = "u-a", "u-b"

	h := newHarness(t, fencing.DefaultConfig())
	for _, o := range nodes {
		h.put(o)
	}
	for _, o := range pvs {
		h.put(o)
	}
	for _, o := range vas {
		h.put(o)
	}

	for _, p := range pvs {
		v := h.index.volumeByPV(p.Name)
		if p.Spec.CSI == nil || p.Spec.CSI.Driver != driver {
			if v != nil {
				t.Errorf("%s: another driver's PV indexed: %+v", p.Name, v)
			}
			continue
		}
		wantClaims, _ := claims.ParseClaims(p.Annotations[claims.ClaimsAnnotation])
		if len(wantClaims) == 0 {
			wantClaims = nil // the index holds "{}" as no claims
		}
		wantRetiring, _ := claims.ParseRetiring(p.Annotations[claims.RetiringAnnotation])
		if v == nil || v.PVName != p.Name || v.Handle != p.Spec.CSI.VolumeHandle || v.ResourceVersion != p.ResourceVersion || !reflect.DeepEqual(v.AccessModes, p.Spec.AccessModes) ||
			v.Block != (p.Spec.VolumeMode != nil && *p.Spec.VolumeMode == block) || !reflect.DeepEqual(v.Claims.Map(), wantClaims) ||
			!reflect.DeepEqual(v.Retiring, wantRetiring) || !reflect.DeepEqual(v.ClaimRef, p.Spec.ClaimRef) ||
			v.bound != (p.Spec.ClaimRef != nil && p.Status.Phase == corev1.VolumeBound) || !v.created.Equal(p.CreationTimestamp.Time) {
			t.Errorf("%s: index entry %+v does not say what the PV says", p.Name, v)
		}
	}
	for _, a := range vas {
		var got []Attachment
		if a.Spec.Source.PersistentVolumeName != nil {
			if v := h.index.volumeByPV(*a.Spec.Source.PersistentVolumeName); v != nil {
				got = v.Attachments
			}
		}
		found := false
		for _, at := range got {
			if at.VAName != a.Name {
				continue
			}
			found = true
			want := Attachment{Node: a.Spec.NodeName, VAName: a.Name, Attached: a.Status.Attached, Since: a.CreationTimestamp.Time}
			if a.DeletionTimestamp != nil {
				want.DetachingSince = a.DeletionTimestamp.Time
			}
			if at.Node != want.Node || at.Attached != want.Attached || !at.Since.Equal(want.Since) || !at.DetachingSince.Equal(want.DetachingSince) {
				t.Errorf("%s: attachment %+v, want %+v", a.Name, at, want)
			}
		}
		if ours := a.Spec.Attacher == driver && a.Spec.Source.PersistentVolumeName != nil; found != ours {
			t.Errorf("%s: indexed %v, want %v", a.Name, found, ours)
		}
	}
	for _, n := range nodes {
		if got := h.index.Node(n.Name); got.Exists != true || got.UID != string(n.UID) || got.Ready != fencing.NodeStateOf(n).Ready ||
			!got.NotReadySince.Equal(fencing.NodeStateOf(n).NotReadySince) || got.OutOfService != fencing.NodeStateOf(n).OutOfService {
			t.Errorf("%s: index says %+v, the Node %+v", n.Name, got, fencing.NodeStateOf(n))
		}
	}
	// The driver's own out-of-service taint (what lifts it) goes through
	// the records in TestRecoveryNeedsASteadyPeriod.
}

// TestRelistQueuesOnlyWhatChanged: a watch that expires (410 Gone: the
// API server restarted, etcd compacted past it) makes the informers list
// again and deliver every object as an update. The PVs and
// VolumeAttachments that did not change are not queued (at 100k volumes
// 200 000 keys, whose sets the work queue would keep for good); one
// that changed meanwhile is, and is indexed.
func TestRelistQueuesOnlyWhatChanged(t *testing.T) {
	var objs []runtime.Object
	for i := 0; i < 20; i++ {
		objs = append(objs, pv(fmt.Sprintf("pv-%d", i), fmt.Sprintf("vol-%d", i), corev1.ReadWriteOnce, ""),
			va(fmt.Sprintf("va-%d", i), fmt.Sprintf("pv-%d", i), "node-a", true, t0))
	}
	objs = append(objs, node("node-a", true, t0))
	client := fake.NewClientset(objs...)
	var mu sync.Mutex
	watches := map[string][]*watch.RaceFreeFakeWatcher{}
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		resource := a.GetResource()
		src, err := client.Tracker().Watch(resource, a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		w := watch.NewRaceFreeFake()
		mu.Lock()
		watches[resource.Resource] = append(watches[resource.Resource], w)
		mu.Unlock()
		go func() {
			for ev := range src.ResultChan() {
				w.Action(ev.Type, ev.Object)
			}
		}()
		t.Cleanup(src.Stop)
		return true, w, nil
	})
	index, adds, ctx := startCounted(t, client)
	lists := func(resource string) int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "list" && a.GetResource().Resource == resource {
				n++
			}
		}
		return n
	}
	expired := &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: "too old resource version"}
	for _, resource := range []string{"persistentvolumes", "volumeattachments"} {
		waitUntil(t, "a watch of "+resource, func() bool { mu.Lock(); defer mu.Unlock(); return len(watches[resource]) == 1 })
		mu.Lock()
		watches[resource][0].Error(expired)
		mu.Unlock()
		waitUntil(t, "a second LIST of "+resource, func() bool { return lists(resource) == 2 })
		waitUntil(t, "a new watch of "+resource, func() bool { mu.Lock(); defer mu.Unlock(); return len(watches[resource]) == 2 })
	}
	// One change of each kind after the relists: each informer hands its
	// events to the handler in order, but the two informers run apart,
	// so only once both changes are indexed has every update both
	// relists delivered been handled.
	changed := pv("pv-3", "vol-3", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`)
	changed.ResourceVersion = "changed"
	if _, err := client.CoreV1().PersistentVolumes().Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StorageV1().VolumeAttachments().Update(ctx, va("va-4", "pv-4", "node-a", false, t0), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the PV's change indexed", func() bool { return index.Volume("vol-3").HasClaim("node-a") })
	waitUntil(t, "the VolumeAttachment's change indexed", func() bool {
		a, ok := index.Volume("vol-4").AttachmentOn("node-a")
		return ok && !a.Attached
	})
	if n := adds.n.Load(); n != 2 {
		t.Errorf("%d adds to the work queue after relists of 20 unchanged PVs and 20 unchanged VolumeAttachments and two changes; want 2", n)
	}
	if s := index.Stats(); s != (Stats{Volumes: 20, Attachments: 20, Nodes: 1}) {
		t.Errorf("index after the relists: %+v", s)
	}
}

// sameRecord tells an update the index must see from one it need not.
func TestSameRecord(t *testing.T) {
	m := newRecordMaker(driver)
	rec := func(o runtime.Object) any {
		r, err := m.record(o)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	pv1 := pv("pv-1", "vol-1", corev1.ReadWriteOnce, "")
	pv1again := pv1.DeepCopy()
	pv1again.Labels = map[string]string{"unread": "x"}
	pv2 := pv1.DeepCopy()
	pv2.ResourceVersion = "2"
	noVersion := pv1.DeepCopy()
	noVersion.ResourceVersion = ""
	va1 := va("va-1", "pv-1", "node-a", true, t0)
	va1again := va1.DeepCopy()
	va1again.Finalizers = []string{"external-attacher/x"} // not read by the index
	detached := va1.DeepCopy()
	detached.Status.Attached = false
	deleting := va1.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	// Deleted and re-created under the same name while the watch was
	// down: a PV gets a new resourceVersion; a VolumeAttachment created
	// in the same second with the same spec and status indexes exactly
	// as the old one (the record is all the index keeps of it).
	pv1recreated := pv1.DeepCopy()
	pv1recreated.UID, pv1recreated.ResourceVersion = "uid-2", "7"
	va1recreated := va1.DeepCopy()
	va1recreated.UID = "uid-2"
	n := node("node-a", true, t0)
	for _, tc := range []struct {
		name     string
		old, new any
		same     bool
	}{
		{"PV re-created under its name", rec(pv1), rec(pv1recreated), false},
		{"VolumeAttachment re-created under its name, alike", rec(va1), rec(va1recreated), true},
		{"PV at the same resourceVersion", rec(pv1), rec(pv1again), true},
		{"PV at another resourceVersion", rec(pv1), rec(pv2), false},
		{"PV without a resourceVersion", rec(noVersion), rec(noVersion.DeepCopy()), false},
		{"PV with other claims at the same resourceVersion (a fake's write)", rec(pv1), rec(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`)), false},
		{"VolumeAttachment, a field the index does not read", rec(va1), rec(va1again), true},
		{"VolumeAttachment detached", rec(va1), rec(detached), false},
		{"VolumeAttachment being deleted", rec(va1), rec(deleting), false},
		{"Node, always queued", rec(n), rec(n.DeepCopy()), false},
		{"a PV record and a VolumeAttachment record", rec(pv1), rec(va1), false},
	} {
		if got := sameRecord(tc.old, tc.new); got != tc.same {
			t.Errorf("%s: sameRecord = %t, want %t", tc.name, got, tc.same)
		}
	}
}

// A relist after an expired watch decodes the objects anew, in the
// client's codec: records of one object decoded from JSON and from
// protobuf are the same, or every relist would queue them all again in
// a real cluster (the fake clientset hands out copies, never decodes).
func TestSameRecordAcrossCodecs(t *testing.T) {
	deleting := va("va-1", "pv-1", "node-a", true, t0)
	deleting.DeletionTimestamp = &metav1.Time{Time: t0.Add(time.Minute)}
	bound := pv("pv-1", "vol-1", corev1.ReadWriteMany, `{"node-a":"2026-11-22T12:00:00Z"}`)
	bound.CreationTimestamp = metav1.NewTime(t0)
	bound.Status.Phase = corev1.VolumeBound
	codecs := serializer.NewCodecFactory(scheme.Scheme)
	m := newRecordMaker(driver)
	for obj, version := range map[runtime.Object]schema.GroupVersion{deleting: storagev1.SchemeGroupVersion, bound: corev1.SchemeGroupVersion} {
		var recs []any
		for _, mediaType := range []string{runtime.ContentTypeJSON, runtime.ContentTypeProtobuf} {
			info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), mediaType)
			if !ok {
				t.Fatalf("no serializer for %s", mediaType)
			}
			data, err := runtime.Encode(codecs.EncoderForVersion(info.Serializer, version), obj)
			if err != nil {
				t.Fatal(err)
			}
			decoded, err := runtime.Decode(codecs.UniversalDeserializer(), data)
			if err != nil {
				t.Fatal(err)
			}
			r, err := m.record(decoded)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		for i, old := range recs {
			for j, new := range recs {
				if !sameRecord(old, new) {
					t.Errorf("%T decoded twice (codecs %d and %d): not the same record", obj, i, j)
				}
			}
		}
	}
}

// Every field of a PV record counts in sameAs: a field added to pvRecord
// and left out of sameAs would let a change of it go unindexed.
func TestPVRecordSameAsEveryField(t *testing.T) {
	m := newRecordMaker(driver)
	r, err := m.record(pv("pv-1", "vol-1", corev1.ReadWriteOnce, `{"node-a":"2026-11-22T12:00:00Z"}`))
	if err != nil {
		t.Fatal(err)
	}
	base := *r.(*pvRecord)
	if !base.sameAs(&base) {
		t.Fatal("a record is not the same as itself")
	}
	fields := reflect.TypeOf(base)
	for i := 0; i < fields.NumField(); i++ {
		other := base
		f := reflect.ValueOf(&other).Elem().Field(i)
		f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
		switch v := f.Addr().Interface().(type) {
		case *objectName:
			v.name += "-other"
		case *string:
			*v += "-other"
		case *bool:
			*v = !*v
		case *time.Time:
			*v = v.Add(time.Second)
		case *[]corev1.PersistentVolumeAccessMode:
			*v = append(slices.Clone(*v), corev1.ReadWriteOncePod)
		case **corev1.ObjectReference:
			*v = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Name: "other"}
		default:
			t.Fatalf("pvRecord.%s: a field of type %s this test cannot change; teach it, and sameAs", fields.Field(i).Name, f.Type())
		}
		if base.sameAs(&other) {
			t.Errorf("pvRecord.%s changed, and sameAs still says the same", fields.Field(i).Name)
		}
	}
}

// Two VolumeAttachments of one PV on one node (hand-made names beside the
// attacher's): the one that stays is in the index after the other goes,
// whichever of them the index saw last.
func TestTwoAttachmentsOnOneNodeKeepTheSurvivor(t *testing.T) {
	for _, gone := range []string{"va-first", "va-second"} {
		t.Run(gone+" deleted", func(t *testing.T) {
			h := newHarness(t, fencing.DefaultConfig())
			h.put(node("node-a", true, t0))
			h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, ""))
			first := va("va-first", "pv-1", "node-a", true, t0)
			second := va("va-second", "pv-1", "node-a", true, t0.Add(time.Minute))
			h.put(first, second)
			byName := map[string]*storagev1.VolumeAttachment{"va-first": first, "va-second": second}
			h.remove(byName[gone])
			a, ok := h.index.Volume("vol-1").AttachmentOn("node-a")
			if !ok || a.VAName == gone || !a.Attached {
				t.Fatalf("after %s was deleted the index shows %+v (found %t); want the surviving VolumeAttachment", gone, a, ok)
			}
			if hs := h.index.Volume("vol-1").Holders(); len(hs) != 1 || hs[0].Node != "node-a" {
				t.Fatalf("holders %+v; want node-a, whose VolumeAttachment still stands", hs)
			}
		})
	}
	t.Run("one being deleted", func(t *testing.T) {
		h := newHarness(t, fencing.DefaultConfig())
		h.put(node("node-a", true, t0))
		h.put(pv("pv-1", "vol-1", corev1.ReadWriteOnce, ""))
		deleting := va("va-first", "pv-1", "node-a", true, t0)
		gone := metav1.NewTime(t0.Add(time.Hour))
		deleting.DeletionTimestamp = &gone
		h.put(deleting, va("va-second", "pv-1", "node-a", true, t0.Add(time.Minute)))
		v := h.index.Volume("vol-1")
		if a, _ := v.AttachmentOn("node-a"); a.VAName != "va-second" {
			t.Fatalf("node-a's attachment is %s; want the one not being deleted", a.VAName)
		}
		if hs := v.Holders(); len(hs) != 1 || !hs[0].DetachingSince.IsZero() {
			t.Fatalf("holders %+v; want node-a holding, not detaching: one of its VolumeAttachments stands", hs)
		}
	})
}

// lease is node's kubelet Lease at resourceVersion rv.
func lease(node, rv string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: fencing.NodeLeaseNamespace, ResourceVersion: rv}}
}

// leaseFor is a node's kubelet Lease stating its duration (the kubelet's
// nodeLeaseDurationSeconds; it renews every quarter of it).
func leaseFor(node, rv string, duration time.Duration) *coordinationv1.Lease {
	l := lease(node, rv)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(duration / time.Second))
	return l
}

// pluginNamespace holds the node plugins' Leases in these tests.
const pluginNamespace = "rds-csi"

// pluginLeaseOf is node's plugin Lease as pkg/nodelease writes it.
func pluginLeaseOf(node, rv string, duration time.Duration) *coordinationv1.Lease {
	name, err := nodelease.Name(node)
	if err != nil {
		panic(err)
	}
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pluginNamespace, ResourceVersion: rv,
			Labels: map[string]string{nodelease.Label: nodelease.LabelValue}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(duration / time.Second))},
	}
}

// claimOn is node's claim in cs, or none.
func claimOn(cs claims.Set, node string) claims.Claim {
	c, _ := cs.Get(node)
	return c
}

func itoa(i int) string { return string(rune('0' + i)) }
