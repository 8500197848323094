//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
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
	e := newScaleEnv(t, "", time.Minute)
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

	metrics := "http://" + httpAddr + "/metrics"
	if _, err := waitIndexed(ctx, tl, metrics, time.Minute, spec, true); err != nil {
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

// newScaleEnv is the control plane of the scale scenarios: etcdBin "" is
// the harness's etcd; pvSync the PV binder's resync period.
func newScaleEnv(t *testing.T, etcdBin string, pvSync time.Duration) *framework.Env {
	return framework.NewEnv(t, framework.EnvOptions{
		QuietObjects: true,
		ControlPlane: framework.ControlPlaneOptions{
			EtcdBin: etcdBin,
			// The scale Nodes have no kubelet renewing a Lease: keep the
			// node lifecycle controller from marking 1k nodes NotReady
			// (and tainting them) while the driver starts.
			NodeMonitorGracePeriod: time.Hour,
			// The PV binder's default 2s resync of every PV in the
			// harness's control plane would dominate the CPU at 10k PVs.
			ExtraKCMArgs: "--pvclaimbinder-sync-period=" + pvSync.String(),
		},
	})
}

// indexSize is what the driver's index gauges say.
type indexSize struct{ volumes, attachments, nodes float64 }

// waitIndexed waits until the driver's index gauges (refreshed every
// 10 s) count spec's PVs, VolumeAttachments and Nodes: exactly, or at
// least (other objects may count too).
func waitIndexed(ctx context.Context, tl *framework.Timeline, metrics string, timeout time.Duration, spec framework.ScaleSpec, exact bool) (indexSize, error) {
	var got indexSize
	_, err := framework.WaitFor(ctx, tl, timeout, "index gauges count every PV, VolumeAttachment and Node", func(ctx context.Context) (bool, string, error) {
		for _, g := range []struct {
			series string
			v      *float64
		}{{"rds_csi_index_volumes", &got.volumes}, {"rds_csi_index_attachments", &got.attachments}, {"rds_csi_index_nodes", &got.nodes}} {
			v, err := framework.ScrapeMetric(ctx, metrics, g.series)
			if err != nil {
				return false, err.Error(), nil
			}
			*g.v = v
		}
		want := indexSize{float64(spec.PVs), float64(spec.PVs), float64(spec.Nodes)}
		ok := got == want || !exact && got.volumes >= want.volumes && got.attachments >= want.attachments && got.nodes >= want.nodes
		return ok, fmt.Sprintf("volumes %g, attachments %g, nodes %g (want %d, %d, %d)", got.volumes, got.attachments, got.nodes, spec.PVs, spec.PVs, spec.Nodes), nil
	})
	return got, err
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

// The driver's informers stream their initial sync where kube-apiserver
// offers watch-list (over the harness's etcd 3.6) and LIST where it
// refuses (over Debian's etcd 3.4.23, which lacks RequestWatchProgress),
// the driver logging which; the index is complete either way. The LISTs
// of PVs, VolumeAttachments and Nodes kube-apiserver serves during the
// start say what the informers did: one per informer on the LIST path,
// none of the driver's on the stream (kube-controller-manager, started
// before, may add one now and then, never three).
func TestInitialSyncPath(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, etcd, wantPath string
		wantLists            bool
	}{
		{name: "the harness's etcd: watch-list", wantPath: "watch-list"},
		{name: "etcd without RequestWatchProgress: LIST", etcd: "/usr/bin/etcd", wantPath: "list", wantLists: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.etcd != "" {
				if why := etcdWithoutWatchProgress(tc.etcd); why != "" {
					t.Skip(why)
				}
			}
			e := newScaleEnv(t, tc.etcd, time.Minute)
			ctx, tl := e.Ctx, e.TL
			sim := e.StartSim(framework.SimOptions{})
			dep := framework.Deploy(ctx, t, tl, e.CP, e.Dir)
			bin := framework.BuildPlainDriver(t, tl, e.Root)
			spec := framework.ScaleSpec{PVs: 40, Nodes: 4, ClaimEvery: 4}
			if _, err := framework.CreateScaleObjects(ctx, tl, e.CP.Config, spec, 8); err != nil {
				t.Fatal(err)
			}
			before, err := apiserverInformerLists(ctx, e.CP.Client)
			if err != nil {
				t.Fatal(err)
			}
			port, err := framework.FreePort()
			if err != nil {
				t.Fatal(err)
			}
			d := framework.StartDriver(t, tl, bin, e.Dir, sim, dep, framework.DriverOptions{
				ExtraArgs: []string{"--http-endpoint=127.0.0.1:" + strconv.Itoa(port)},
			})
			after, err := apiserverInformerLists(ctx, e.CP.Client)
			if err != nil {
				t.Fatal(err)
			}
			log, err := os.ReadFile(d.LogPath)
			if err != nil {
				t.Fatal(err)
			}
			if path := loggedSyncPath(string(log)); path != tc.wantPath {
				t.Errorf("the driver logged the initial sync path %q, want %q", path, tc.wantPath)
			}
			if lists := after - before; tc.wantLists != (lists >= 3) {
				t.Errorf("kube-apiserver served %g LISTs of PVs, VolumeAttachments and Nodes during the driver's start; want 3 or more: %v", lists, tc.wantLists)
			}
			metrics := "http://127.0.0.1:" + strconv.Itoa(port) + "/metrics"
			if _, err := waitIndexed(ctx, tl, metrics, time.Minute, spec, true); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// etcdWithoutWatchProgress is "" when bin is an etcd older than 3.4.31
// (the first 3.4 with RequestWatchProgress), else why it cannot serve the
// test.
func etcdWithoutWatchProgress(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return fmt.Sprintf("%s: %v", bin, err)
	}
	m := regexp.MustCompile(`etcd Version: 3\.4\.(\d+)`).FindSubmatch(out)
	if m == nil {
		return fmt.Sprintf("%s is no etcd 3.4 (%q)", bin, firstLine(string(out)))
	}
	if patch, _ := strconv.Atoi(string(m[1])); patch >= 31 {
		return fmt.Sprintf("%s is etcd 3.4.%d, which has RequestWatchProgress", bin, patch)
	}
	return ""
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
