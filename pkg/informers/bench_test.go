package informers

import (
	"context"
	"fmt"
	"math/rand"
	"runtime"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

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
			e.Claims = map[string]Claim{node: {At: t0}}
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
			p.Annotations[ClaimsAnnotation] = `{"other":"2026-11-22T12:00:00Z"}`
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
