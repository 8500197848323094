package informers

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"runtime"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// fillIndex puts volumes PVs, each attached to one of nodes nodes (plus a
// claim), into a new index the way the worker would.
func fillIndex(volumes, nodes int) *AttachmentIndex {
	x := NewAttachmentIndex()
	for n := 0; n < nodes; n++ {
		x.setNode(fmt.Sprintf("node-%05d", n), NodeState{Exists: true, Ready: true})
	}
	for v := 0; v < volumes; v++ {
		pvName := fmt.Sprintf("pvc-%08d", v)
		node := fmt.Sprintf("node-%05d", v%nodes)
		x.setPV(pvName, func(e *Volume) {
			e.Handle = pvName
			e.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
			e.ResourceVersion = "12345"
			e.Claims = claims.NewSet(map[string]claims.Claim{node: {At: t0}})
		})
		x.setAttachment("va-"+pvName, pvName, Attachment{Node: node, VAName: "va-" + pvName, Attached: true, Since: t0})
	}
	return x
}

// BenchmarkPublishDecision: the index lookup, the holders and the policy
// decision ControllerPublish makes, with 100k volumes on 10k nodes in the
// index. Reports p50 and p99 besides the mean.
func BenchmarkPublishDecision(b *testing.B) {
	const volumes, nodes = 100_000, 10_000
	x := fillIndex(volumes, nodes)
	cfg := fencing.DefaultConfig()
	now := t0.Add(time.Hour)
	rng := rand.New(rand.NewSource(1))
	lat := make([]time.Duration, 0, b.N)
	refused := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h := fmt.Sprintf("pvc-%08d", rng.Intn(volumes))
		node := fmt.Sprintf("node-%05d", rng.Intn(nodes))
		start := time.Now()
		v := x.Volume(h)
		d := fencing.Decide(fencing.Request{VolumeID: h, Node: node}, v.Holders(), x.Node, now, cfg)
		lat = append(lat, time.Since(start))
		if d.Verdict == fencing.Refuse {
			refused++
		}
	}
	b.StopTimer()
	if refused == 0 {
		b.Fatal("no decision was a refusal; the index is not what it should be")
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkIndexMemory: heap held by the index per attachment (each with
// its PV entry and one claim), at 100k volumes.
func BenchmarkIndexMemory(b *testing.B) {
	const volumes, nodes = 100_000, 10_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := fillIndex(volumes, nodes)
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ResetTimer()
	// The loop measures what a scrape of the index size costs; the memory
	// figure is the point of this benchmark.
	for i := 0; i < b.N; i++ {
		if x.Stats().Attachments != volumes {
			b.Fatalf("index holds %d attachments", x.Stats().Attachments)
		}
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/volumes, "bytes/attachment")
}

type signalReactor chan fencing.StaleHolder

func (r signalReactor) MigrationTimedOut(context.Context, fencing.VolumeRef, fencing.Migration) error {
	return nil
}

func (r signalReactor) OrphanedClaim(context.Context, fencing.VolumeRef, string, time.Duration) error {
	return nil
}

func (r signalReactor) NodeStale(_ context.Context, s fencing.StaleHolder) error {
	r <- s
	return nil
}

// BenchmarkNodeDeletionToFence: from the API call deleting a node that
// holds volumes to the Reactor being told (the fence decision), through
// the real informers and workqueue on a fake API with 1000 volumes.
func BenchmarkNodeDeletionToFence(b *testing.B) {
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for v := 0; v < 1000; v++ {
		p := pv(fmt.Sprintf("pv-%04d", v), fmt.Sprintf("vol-%04d", v), corev1.ReadWriteOnce, `{"victim":"2026-11-22T12:00:00Z"}`)
		if v%10 != 0 {
			p.Annotations[claims.ClaimsAnnotation] = `{"other":"2026-11-22T12:00:00Z"}`
		}
		if _, err := client.CoreV1().PersistentVolumes().Create(ctx, p, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	reactions := make(signalReactor, 1)
	x := NewAttachmentIndex()
	c, err := NewController(client, x, Config{DriverName: driver, Policy: fencing.DefaultConfig(), Reactor: reactions})
	if err != nil {
		b.Fatal(err)
	}
	go c.Run(ctx)
	if !c.WaitForSync(ctx) {
		b.Fatal("never synced")
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if _, err := client.CoreV1().Nodes().Create(ctx, node("victim", true, t0), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		for !x.Node("victim").Exists {
			runtime.Gosched()
		}
		b.StartTimer()
		if err := client.CoreV1().Nodes().Delete(ctx, "victim", metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
		s := <-reactions
		if s.Reason != fencing.FenceNodeDeleted || len(s.Volumes) != 100 {
			b.Fatalf("reaction %s with %d volumes, want NodeDeleted with 100", s.Reason, len(s.Volumes))
		}
	}
}

// scaleObjects returns n PVs of the driver, each with an attached
// VolumeAttachment, and n/20 Nodes, shaped like what an API server
// returns for the e2e scale scenario (e2e/framework/scale.go): managed
// fields, a claim on every 4th PV, every 10th raw-block RWX.
func scaleObjects(n int) []k8sruntime.Object {
	nodes := n / 20
	created := metav1.NewTime(t0)
	managed := []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &created,
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{".":{},"f:pv.kubernetes.io/provisioned-by":{}}},"f:spec":{"f:accessModes":{},"f:capacity":{".":{},"f:storage":{}},"f:claimRef":{".":{},"f:name":{},"f:namespace":{},"f:uid":{}},"f:csi":{".":{},"f:driver":{},"f:fsType":{},"f:volumeAttributes":{".":{},"f:nqn":{}},"f:volumeHandle":{}}}}`)}}}
	objs := make([]k8sruntime.Object, 0, 2*n+nodes)
	for i := 0; i < nodes; i++ {
		nd := node(fmt.Sprintf("scale-node-%04d", i), true, t0)
		nd.UID = types.UID(fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i))
		nd.ResourceVersion = fmt.Sprint(i + 1)
		nd.CreationTimestamp = created
		nd.ManagedFields = managed
		nd.Labels = map[string]string{"kubernetes.io/hostname": nd.Name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
		nd.Annotations = map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"}
		nd.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: nd.Name}}
		nd.Status.Capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}
		nd.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.36.3", OperatingSystem: "linux", Architecture: "amd64"}
		objs = append(objs, nd)
	}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("pvc-%08x-5ca1-4e00-8000-%012x", i, i)
		nodeName := fmt.Sprintf("scale-node-%04d", i%nodes)
		held := ""
		if i%4 == 0 {
			held = fmt.Sprintf(`{%q:"2026-11-22T12:00:00Z"}`, nodeName)
		}
		p := pv(name, name, corev1.ReadWriteOnce, held)
		p.ResourceVersion = fmt.Sprint(nodes + 2*i + 1)
		p.CreationTimestamp = created
		p.ManagedFields = managed
		p.Annotations["pv.kubernetes.io/provisioned-by"] = driver
		delete(p.Annotations, "other")
		p.Spec.ClaimRef.UID = types.UID(fmt.Sprintf("%08x-c1a1-4e00-8000-%012x", i, i))
		p.Spec.ClaimRef.Name = fmt.Sprintf("data-%d", i)
		p.Spec.Capacity = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}
		p.Spec.StorageClassName = "rds-scale"
		p.Spec.CSI.FSType = "ext4"
		p.Spec.CSI.VolumeAttributes = map[string]string{"nqn": "nqn.2000-02.com.mikrotik:" + name, "nvmeAddress": "127.0.0.1", "nvmePort": "4420"}
		p.Status.Phase = corev1.VolumeBound
		if i%10 == 0 {
			p.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
			block := corev1.PersistentVolumeBlock
			p.Spec.VolumeMode = &block
		}
		a := va(claims.VolumeAttachmentName(name, driver, nodeName), name, nodeName, true, t0)
		a.ResourceVersion = fmt.Sprint(nodes + 2*i + 2)
		a.ManagedFields = managed
		objs = append(objs, p, a)
	}
	return objs
}

// decodingClient is a fake API holding objs whose LISTs return a decoded
// copy, as from a real API server: otherwise the informers' caches would
// share every string with the fake's own objects, and a measurement of
// their memory would leave the strings out.
func decodingClient(objs ...k8sruntime.Object) *fake.Clientset {
	client := fake.NewClientset(objs...)
	client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		l := a.(k8stesting.ListActionImpl)
		list, err := client.Tracker().List(l.GetResource(), l.GetKind(), l.GetNamespace(), l.ListOptions)
		if err != nil {
			return true, nil, err
		}
		b, err := json.Marshal(list)
		if err != nil {
			return true, nil, err
		}
		fresh := reflect.New(reflect.TypeOf(list).Elem()).Interface().(k8sruntime.Object)
		return true, fresh, json.Unmarshal(b, fresh)
	})
	return client
}

// BenchmarkHeapPerVolume: the live heap the controller keeps per attached
// volume once it has synced and indexed what the API held at start-up,
// through the real informers (their caches after the transform), the
// workqueue and the index, on a fake API holding 20 000 PVs with their
// attached VolumeAttachments and 1000 Nodes. The fake API's own copy of
// the objects is outside the measurement.
func BenchmarkHeapPerVolume(b *testing.B) {
	const volumes = 20_000
	client := decodingClient(scaleObjects(volumes)...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := NewAttachmentIndex()
	c, err := NewController(client, x, Config{DriverName: driver, Policy: fencing.DefaultConfig()})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if !c.WaitForSync(ctx) {
		b.Fatal("never synced")
	}
	// Every informer watching: their LIST responses are garbage now.
	for c.WatchesHealthy(-1) != nil {
		runtime.Gosched()
	}
	// Three collections: sync.Pools (encoding/json's buffers of the
	// LISTs) let go of what they hold over two.
	runtime.GC()
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(client)
	b.ResetTimer()
	// Measured once (a sync of 20 000 volumes takes seconds); the loop
	// checks the index, so that make bench's -benchtime 200x costs
	// nothing more.
	for i := 0; i < b.N; i++ {
		if s := x.Stats(); s.Volumes != volumes || s.Attachments != volumes {
			b.Fatalf("index holds %+v", s)
		}
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/volumes, "bytes/volume")
}
