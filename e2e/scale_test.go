//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// Scenario 7: the driver's controller starts against an API that already
// holds many of its PVs, their VolumeAttachments and the Nodes: how long
// until it is ready (CSI Probe), how much memory it then holds, and its
// attachment index is complete. The numbers are reported (timeline, test
// log, docs/BENCHMARKS.md), not asserted: only readiness within
// StartDriver's deadline and the index's counts are.
//
// By default a tenth of the size of issue 7 (1k PVs and attachments, 100
// Nodes); RDS_CSI_E2E_SCALE=full for 10k PVs, 10k VolumeAttachments and
// 1k Nodes.
func TestScaleControllerStart(t *testing.T) {
	spec, size := framework.ScaleFromEnv()
	e := framework.NewEnv(t, framework.EnvOptions{
		QuietObjects: true,
		ControlPlane: framework.ControlPlaneOptions{
			// The scale Nodes have no kubelet renewing a Lease: keep the
			// node lifecycle controller from marking 1k nodes NotReady
			// (and tainting them) while the driver starts.
			NodeMonitorGracePeriod: time.Hour,
			// The PV binder's default 2s resync of every PV in the
			// harness's control plane would dominate the CPU at 10k PVs.
			ExtraKCMArgs: "--pvclaimbinder-sync-period=1m",
		},
	})
	ctx, tl := e.Ctx, e.TL
	tl.Logf("scale: %s: %d PVs (every %dth with claims, every %dth RWX block), %d VolumeAttachments, %d Nodes",
		size, spec.PVs, spec.ClaimEvery, spec.RWXBlockEvery, spec.PVs, spec.Nodes)
	sim := e.StartSim(framework.SimOptions{})
	dep := framework.Deploy(ctx, t, tl, e.CP, e.Dir)
	bin := framework.BuildPlainDriver(t, tl, e.Root)

	done := tl.Step("create the objects in the API")
	created, err := framework.CreateScaleObjects(ctx, tl, e.CP.Config, spec, 32)
	if err != nil {
		t.Fatal(err)
	}
	done()

	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := "127.0.0.1:" + strconv.Itoa(port)
	done = tl.Step("start the driver controller (no -race) and wait for Probe ready")
	t0 := time.Now()
	d := framework.StartDriver(t, tl, bin, e.Dir, sim, dep, framework.DriverOptions{
		ExtraArgs: []string{"--http-endpoint=" + httpAddr, "--v=2"},
	})
	ready := time.Since(t0)
	memReady, err := framework.ReadProcMemory(d.Pid())
	if err != nil {
		t.Fatal(err)
	}
	done()
	tl.Logf("ready after %s; VmRSS %s, VmHWM %s", ready.Round(time.Millisecond), framework.MiB(memReady.RSS), framework.MiB(memReady.PeakRSS))

	// The index-size gauges are refreshed every 10 s.
	metrics := "http://" + httpAddr + "/metrics"
	want := map[string]int{
		"rds_csi_index_volumes":     spec.PVs,
		"rds_csi_index_attachments": spec.PVs,
		"rds_csi_index_nodes":       spec.Nodes,
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "index gauges show every PV, VolumeAttachment and Node", func(ctx context.Context) (bool, string, error) {
		state := ""
		ok := true
		for _, series := range []string{"rds_csi_index_volumes", "rds_csi_index_attachments", "rds_csi_index_nodes"} {
			v, err := framework.ScrapeMetric(ctx, metrics, series)
			if err != nil {
				return false, err.Error(), nil
			}
			state += fmt.Sprintf("%s=%g (want %d) ", series, v, want[series])
			ok = ok && v == float64(want[series])
		}
		return ok, state, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "/readyz answers 200", scaleReadyz("http://"+httpAddr+"/readyz")); err != nil {
		t.Fatal(err)
	}
	memIndexed, err := framework.ReadProcMemory(d.Pid())
	if err != nil {
		t.Fatal(err)
	}
	// The Go heap in use, for comparison with the RSS (which also holds
	// freed memory not yet returned to the kernel).
	heap, err := framework.ScrapeMetric(ctx, metrics, "go_memstats_heap_inuse_bytes")
	if err != nil {
		t.Fatal(err)
	}
	summary := fmt.Sprintf("scale %s: created %d Nodes in %s, %d PVs in %s, %d VolumeAttachments (+status) in %s (%d requests, %.0f/s); "+
		"driver start -> Probe ready %s; VmRSS at ready %s, with the index gauges complete %s (VmHWM %s, Go heap in use %s)",
		size, spec.Nodes, created.Nodes.Round(time.Millisecond), spec.PVs, created.PVs.Round(time.Millisecond), spec.PVs, created.Attachments.Round(time.Millisecond),
		created.Requests, float64(created.Requests)/created.Total().Seconds(),
		ready.Round(time.Millisecond), framework.MiB(memReady.RSS), framework.MiB(memIndexed.RSS), framework.MiB(memIndexed.PeakRSS), framework.MiB(int64(heap)))
	tl.Logf("%s", summary)
	t.Log(summary)
}

func scaleReadyz(url string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, "", err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error(), nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	}
}
