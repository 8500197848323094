//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// Publish latency on a healthy box while another box hangs (issue 36; a
// measurement like TestPublishLatency, only with RDS_CSI_E2E_BENCH=1,
// `make bench-publish`): the driver (no race detector) serves the default
// box (the in-process simulator, RDS_CSI_E2E_BENCH_RDS_LATENCY per
// command) and rds-b (an rds-sim process), with storage fencing, so every
// publish changes or checks an export on its box. Three RWO volumes of
// the default box and one of rds-b are attached to node-a. Then the
// default box's volumes are published again and again, as
// TestPublishLatency does: with rds-b answering (...OtherBoxHealthy), and
// with rds-b frozen (SIGSTOP: every command to it hangs until its 10 s
// timeout) while rds-b's attachment is marked for a new publish every
// second beside them (...OtherBoxHanging; csi-attacher's backoff spaces
// the calls it makes, each of which hangs until it fails naming rds-b). It logs the p50, p90 and p99 of the default box's
// successful publishes, as the driver's gRPC interceptor timed them.
func TestPublishLatencyOtherBoxHealthy(t *testing.T) { publishLatencyBoxes(t, false) }

func TestPublishLatencyOtherBoxHanging(t *testing.T) { publishLatencyBoxes(t, true) }

func publishLatencyBoxes(t *testing.T, hang bool) {
	if os.Getenv("RDS_CSI_E2E_BENCH") != "1" {
		t.Skip("a measurement: set RDS_CSI_E2E_BENCH=1 (make bench-publish)")
	}
	latency, repeats := benchSettings(t)
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	ns := framework.TestNamespace
	sim := e.StartSim(framework.SimOptions{})
	sim.SetLatency(latency)
	b := framework.StartSimProcess(t, tl, e.Root, e.Dir, "rds-b", 0)
	cfg := b.Box(4421)
	cfg.CommandTimeout = "10s"
	list := framework.WriteRDSConfig(t, e.Dir, cfg)
	node := e.NewNode("node-a")
	// What node-a's plugin reports with that list (TestVolumesGoToTheBoxes...
	// reads it from a real one).
	if err := node.RegisterTopology(ctx, &csipb.NodeGetInfoResponse{AccessibleTopology: &csipb.Topology{Segments: map[string]string{
		defaultBoxKey: framework.RDSName, boxKeyPrefix + framework.RDSName: "true", boxKeyPrefix + "rds-b": "true"}}}); err != nil {
		t.Fatal(err)
	}
	framework.DeployFile(ctx, t, tl, e.CP, "manifests/overlays/storage-fencing/fencing-rbac.yaml")
	ctrl := e.StartController(sim, framework.ControllerOptions{Plain: true,
		DriverArgs: []string{"--storage-fencing=allow-host", "--rds-config=" + list}})
	for _, sc := range []*storagev1.StorageClass{class("on-default", framework.RDSName, false), class("on-b", "rds-b", false)} {
		if _, err := c.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	attach := func(claim, class string) string {
		t.Helper()
		if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, framework.PVC(ns, claim, class, "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var pvName string
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC "+claim+" bound", framework.PVCBound(c, ns, claim, &pvName)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-"+claim, "node-a", claim), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var va storagev1.VolumeAttachment
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, pvName+" attached to node-a", framework.VolumeAttached(c, pvName, "node-a", &va)); err != nil {
			t.Fatal(err)
		}
		return va.Name
	}
	const volumes = 3
	var vas []string
	for i := range volumes {
		vas = append(vas, attach(fmt.Sprintf("data-%d", i), "on-default"))
	}
	onB := attach("on-b", "on-b")
	mode := "rds-b answering"
	if hang {
		mode = "rds-b frozen, its attachment marked for a new publish every second"
		done := tl.Step("rds-b frozen (SIGSTOP)")
		if err := b.Pause(); err != nil {
			t.Fatal(err)
		}
		done()
		stop := make(chan struct{})
		finished := make(chan struct{})
		go func() {
			defer close(finished)
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					_ = framework.RepublishAttachment(ctx, c, onB)
				}
			}
		}()
		defer func() { close(stop); <-finished }()
	}
	before, err := framework.PublishDurations(ctrl.Driver.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	done := tl.Step(fmt.Sprintf("%d repeated publishes of each of %d volumes of the default box (%s)", repeats, volumes, mode))
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
	all, err := framework.PublishDurations(ctrl.Driver.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	// The publishes of this step: rds-b's fail while it is frozen, so the
	// successes since are the default box's.
	ds := since(all, before)
	if want := volumes * repeats; len(ds) < want {
		t.Fatalf("%d successful publishes in the driver's log, want at least %d", len(ds), want)
	}
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	t.Logf("storage fencing, %s per RouterOS command on the default box, %s, the default box's volumes: %d publishes: p50 %s, p90 %s, p99 %s, max %s",
		latency, mode, len(ds), r(framework.Quantile(ds, 0.5)), r(framework.Quantile(ds, 0.9)), r(framework.Quantile(ds, 0.99)), r(framework.Quantile(ds, 1)))
}

// since is all (sorted) without the durations of before (sorted): the
// publishes logged after before was read.
func since(all, before []time.Duration) []time.Duration {
	var out []time.Duration
	i := 0
	for _, d := range all {
		if i < len(before) && before[i] == d {
			i++
			continue
		}
		out = append(out, d)
	}
	return out
}
