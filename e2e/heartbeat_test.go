//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// Issue 23: an API server outage of 60 s fences nobody. Storage fencing
// with the driver's defaults (heartbeat and NotReady thresholds 20 s, the
// mass-outage guard), fake kubelets with a real kubelet's cadence (Lease
// every 10 s, Ready re-posted by their status sync), kube-controller-
// manager's default grace (40 s). Three nodes, the volume on node-a. The
// API server freezes for 60 s: every heartbeat looks stale at once, and
// when it answers again kube-controller-manager marks every node Unknown
// (measured before: the driver then closed the exports of all three
// nodes 16 s later). Nothing may be fenced: the export stays open to
// node-a's attachment through the outage and for the thresholds after it
// (the observation window: a fence comes, if it comes, within the
// thresholds after the API answers), its claim stays, no Fenced event.
func TestAPIServerOutageFencesNobody(t *testing.T) {
	w := startAttachWorldWith(t, attachOptions{grace: 40 * time.Second, fenced: true, cadence: framework.KubeletDefaultCadence,
		driverArgs: []string{"--storage-fencing=allow-host", "--out-of-service-taint"}}, "node-a", "node-b", "node-c")
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL

	done := tl.Step("the export is open to node-a's host alone")
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "export allows node-a only", diskExportTo(w, "node-a")); err != nil {
		t.Fatal(err)
	}
	host, err := framework.AttachmentHost(ctx, c, w.pv, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("kube-apiserver frozen for 60 s")
	resume, err := e.CP.FreezeAPIServer(tl)
	if err != nil {
		t.Fatal(err)
	}
	outage := time.NewTimer(60 * time.Second) // the fault's length, not a wait for anything
	watchExport := func() error {
		if d, ok := w.sim.Disk(w.handle); !ok || !d.NVMeTCPExport || d.AllowHostName != host {
			return fmt.Errorf("the export of %s is exported=%t allow-host=%q, not node-a's attachment %s", w.handle, d.NVMeTCPExport, d.AllowHostName, host)
		}
		return nil
	}
	for waiting := true; waiting; {
		select {
		case <-outage.C:
			waiting = false
		case <-time.After(time.Second):
			if err := watchExport(); err != nil {
				_ = resume()
				t.Fatalf("during the outage: %v", err)
			}
		}
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	done()

	done = tl.Step("after the outage: every node Ready again, nothing fenced for the thresholds after")
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		if _, err := framework.WaitFor(ctx, tl, time.Minute, n+" Ready", framework.NodeReady(c, n, corev1.ConditionTrue)); err != nil {
			t.Error(err)
		}
	}
	// The observation window: the heartbeat and NotReady thresholds (20 s
	// each) after the API answered, plus a margin.
	window := func(context.Context) (bool, string, error) {
		if err := watchExport(); err != nil {
			return false, "", err
		}
		left := 45*time.Second - time.Since(resumed)
		return left <= 0, fmt.Sprintf("export still open to node-a; %s of the window left", left.Round(time.Second)), nil
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "45 s after the outage with node-a's export untouched", window); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "claims name node-a only", framework.ClaimsAre(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	log, err := os.ReadFile(filepath.Join(e.Dir, "rds-csi-driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(log), "fenced stale attachment") {
		t.Error("the driver fenced an attachment during or after the API server outage (rds-csi-driver.log)")
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "mass-outage guard") {
			tl.Logf("driver: %s", line)
		}
	}
	done()
}

// Issue 23: one late kubelet renewal fences nobody. node-a (holding the
// volume) renews every 10 s; right after one renewal its kubelet stalls
// and renews next 16 s later instead of 10 (a late renewal, within the
// 20 s threshold). Its export and claim stay, and the driver logs no
// fence, through the threshold after the stall.
func TestLateRenewalFencesNobody(t *testing.T) {
	w := startAttachWorldWith(t, attachOptions{grace: 40 * time.Second, fenced: true, cadence: framework.KubeletDefaultCadence,
		driverArgs: []string{"--storage-fencing=allow-host", "--out-of-service-taint"}}, "node-a", "node-b", "node-c")
	e := w.e
	ctx, c, tl := e.Ctx, e.Client, e.TL
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "export allows node-a only", diskExportTo(w, "node-a")); err != nil {
		t.Fatal(err)
	}
	host, err := framework.AttachmentHost(ctx, c, w.pv, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	done := tl.Step("node-a's kubelet renews 16 s after its last renewal instead of 10")
	last, err := w.nodes["node-a"].NextRenewal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w.nodes["node-a"].Fail()
	stall := time.NewTimer(time.Until(last.Add(16 * time.Second))) // the fault's length
	<-stall.C
	if err := w.nodes["node-a"].Recover(ctx); err != nil {
		t.Fatal(err)
	}
	done()
	done = tl.Step("nothing fenced through the threshold after the stall")
	window := func(context.Context) (bool, string, error) {
		if d, ok := w.sim.Disk(w.handle); !ok || !d.NVMeTCPExport || d.AllowHostName != host {
			return false, "", fmt.Errorf("the export of %s is exported=%t allow-host=%q, not node-a's attachment %s", w.handle, d.NVMeTCPExport, d.AllowHostName, host)
		}
		left := 25*time.Second - time.Since(last)
		return left <= 0, fmt.Sprintf("export still open to node-a; %s of the window left", left.Round(time.Second)), nil
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "the threshold after the stall with node-a's export untouched", window); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 5*time.Second, "claims name node-a only", framework.ClaimsAre(c, w.pv, "node-a")); err != nil {
		t.Error(err)
	}
	log, err := os.ReadFile(filepath.Join(e.Dir, "rds-csi-driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(log), "fenced stale attachment") {
		t.Error("the driver fenced an attachment after one late renewal (rds-csi-driver.log)")
	}
	done()
}
