//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// Publish latency on a real control plane (a measurement, not a check:
// it runs only with RDS_CSI_E2E_BENCH=1, as `make bench-publish` sets it),
// without storage fencing (TestPublishLatency) and with
// --storage-fencing=allow-host (TestPublishLatencyStorageFencing). Three
// RWO volumes attached to node-a through pods, csi-attacher and the
// driver, the simulator adding RDS_CSI_E2E_BENCH_RDS_LATENCY (default
// 1ms) to every RouterOS command; then each VolumeAttachment is marked not
// attached again and again, so csi-attacher repeats the publish
// (RDS_CSI_E2E_BENCH_REPEATS per volume, default 199: 600 publishes). It
// logs the p50, p90 and p99 of the successful ControllerPublishVolume
// calls of the driver built without the race detector, as its gRPC
// interceptor timed them
// (framework.PublishDurations, the figures of docs/BENCHMARKS.md).
func TestPublishLatency(t *testing.T) { publishLatency(t, false) }

func TestPublishLatencyStorageFencing(t *testing.T) { publishLatency(t, true) }

func publishLatency(t *testing.T, storageFencing bool) {
	if os.Getenv("RDS_CSI_E2E_BENCH") != "1" {
		t.Skip("a measurement: set RDS_CSI_E2E_BENCH=1 (make bench-publish)")
	}
	latency, repeats := benchSettings(t)
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	ns := framework.TestNamespace
	sim := e.StartSim(framework.SimOptions{})
	sim.SetLatency(latency)
	benchNode(e, "node-a")
	// The driver as it is shipped: no race detector, whose
	// instrumentation would be most of what is measured.
	opts, mode := framework.ControllerOptions{Plain: true}, "fencing off"
	if storageFencing {
		framework.DeployFile(ctx, t, tl, e.CP, "manifests/overlays/storage-fencing/fencing-rbac.yaml")
		opts.DriverArgs, mode = []string{"--storage-fencing=allow-host"}, "storage fencing"
	}
	ctrl := e.StartController(sim, opts)
	if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass("rds", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	const volumes = 3
	vas := make([]string, volumes)
	for i := range volumes {
		claim, pod := fmt.Sprintf("data-%d", i), fmt.Sprintf("pod-%d", i)
		if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, framework.PVC(ns, claim, "rds", "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var pvName string
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC "+claim+" bound", framework.PVCBound(c, ns, claim, &pvName)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, pod, "node-a", claim), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var va storagev1.VolumeAttachment
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, pvName+" attached to node-a", framework.VolumeAttached(c, pvName, "node-a", &va)); err != nil {
			t.Fatal(err)
		}
		vas[i] = va.Name
	}
	done := tl.Step(fmt.Sprintf("%d repeated publishes of each of %d volumes", repeats, volumes))
	for r := range repeats {
		for _, name := range vas {
			if err := framework.RepublishAttachment(ctx, c, name); err != nil {
				t.Fatal(err)
			}
			if _, err := framework.WaitFor(ctx, tl, time.Minute, fmt.Sprintf("%s attached again (%d)", name, r+1), attachedVA(c, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	done()
	ds, err := framework.PublishDurations(ctrl.Driver.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := volumes * (repeats + 1); len(ds) < want {
		t.Fatalf("%d successful publishes in the driver's log, want at least %d", len(ds), want)
	}
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	t.Logf("%s, %s per RouterOS command: %d publishes: p50 %s, p90 %s, p99 %s, max %s", mode, latency, len(ds),
		r(framework.Quantile(ds, 0.5)), r(framework.Quantile(ds, 0.9)), r(framework.Quantile(ds, 0.99)), r(framework.Quantile(ds, 1)))
}

// benchSettings are the publish benchmarks' RDS latency
// (RDS_CSI_E2E_BENCH_RDS_LATENCY, default 1ms) and repeats per volume
// (RDS_CSI_E2E_BENCH_REPEATS, default 199).
func benchSettings(t *testing.T) (time.Duration, int) {
	latency := time.Millisecond
	if s := os.Getenv("RDS_CSI_E2E_BENCH_RDS_LATENCY"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("RDS_CSI_E2E_BENCH_RDS_LATENCY=%q: %v", s, err)
		}
		latency = d
	}
	repeats := 199
	if s := os.Getenv("RDS_CSI_E2E_BENCH_REPEATS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			t.Fatalf("RDS_CSI_E2E_BENCH_REPEATS=%q: want a count", s)
		}
		repeats = n
	}
	return latency, repeats
}

// attachedVA holds once VolumeAttachment name is marked attached.
func attachedVA(c kubernetes.Interface, name string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		va, err := c.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return va.Status.Attached, fmt.Sprintf("attached=%t", va.Status.Attached), nil
	}
}
