//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/diagnose"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// annotatePV sets (value != nil) or removes a PV annotation, as an
// operator's kubectl annotate does.
func annotatePV(ctx context.Context, c kubernetes.Interface, pv, key string, value *string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]*string{key: value}}})
	if err != nil {
		return err
	}
	_, err = c.CoreV1().PersistentVolumes().Patch(ctx, pv, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// TestMalformedClaimsFailClosed: on the real control plane, a PV whose
// claims annotation someone mangled is skipped and counted by the driver
// (rds_csi_malformed_objects, a MalformedAnnotation event, never a retry
// loop), its volume is attached to no node (the attach error names the
// annotation), kubectl rds check lists it with the next step, and fixing
// the annotation (restoring it, or removing it from a volume nobody uses)
// brings everything back.
func TestMalformedClaimsFailClosed(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl, ns := e.Ctx, e.Client, e.TL, framework.TestNamespace
	sim := e.StartSim(framework.SimOptions{})
	e.NewNode("node-a")
	e.NewNode("node-b")
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	ctrl := e.StartController(sim, framework.ControllerOptions{DriverArgs: []string{"--http-endpoint=127.0.0.1:" + strconv.Itoa(port)}})
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	malformed := func(want float64) framework.Condition {
		return func(ctx context.Context) (bool, string, error) {
			v, err := framework.ScrapeMetric(ctx, metrics, `rds_csi_malformed_objects{kind="PersistentVolume",reason="unreadable-claims"}`)
			if err != nil {
				return false, err.Error(), nil
			}
			return v == want, fmt.Sprintf("rds_csi_malformed_objects unreadable-claims = %g", v), nil
		}
	}
	transcript, err := os.Create(e.Dir + "/kubectl-rds.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer transcript.Close()
	k := &kubectlRDS{t: t, tl: tl, bin: plugin.Path(t, tl, e.Root), kubeconfig: operatorKubeconfig(t, e),
		inventoryURL: fmt.Sprintf("http://127.0.0.1:%d/inventory", port), transcript: transcript}

	done := tl.Step("claims data and fresh; data attached to node-a")
	if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass("rds", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvs := map[string]string{}
	for _, name := range []string{"data", "fresh"} {
		if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, framework.PVC(ns, name, "rds", "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var pv string
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC "+name+" bound", framework.PVCBound(c, ns, name, &pv)); err != nil {
			t.Fatal(err)
		}
		pvs[name] = pv
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-a", "node-a", "data"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "data attached to node-a", framework.VolumeAttached(c, pvs["data"], "node-a", nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "claims name node-a", claimsAre(c, pvs["data"], "node-a")); err != nil {
		t.Fatal(err)
	}
	dataPV, err := c.CoreV1().PersistentVolumes().Get(ctx, pvs["data"], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := dataPV.Annotations[claims.ClaimsAnnotation]
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "nothing counted malformed", malformed(0)); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("both claims annotations mangled by hand")
	for name, bad := range map[string]string{"data": `{"node-a": 2024-01-01`, "fresh": `{"node-x": "yesterday"}`} {
		if err := annotatePV(ctx, c, pvs[name], claims.ClaimsAnnotation, &bad); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "both counted", malformed(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "MalformedAnnotation event on data's PV",
		framework.EventOn(c, metav1.NamespaceDefault, "PersistentVolume", pvs["data"], fencing.ReasonMalformedAnnotation, nil, claims.ClaimsAnnotation)); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("fresh on node-b: refused, naming the annotation")
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.PodOnNode(ns, "pod-b", "node-b", "fresh"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var refused storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "fresh's attach to node-b refused",
		framework.AttachRefused(c, pvs["fresh"], "node-b", &refused, "FailedPrecondition", claims.ClaimsAnnotation, pvs["fresh"])); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(transcript, "VolumeAttachment %s attach error: %s\n\n", refused.Name, refused.Status.AttachError.Message)
	code, r := k.check()
	if code != 1 || r.Counts[diagnose.FindingClaimsUnreadable] != 2 || len(r.Findings) != 2 {
		t.Errorf("check with two unreadable annotations: exit %d, %+v", code, r)
	}
	for _, f := range r.Findings {
		if f.Kind == diagnose.FindingClaimsUnreadable && !strings.Contains(f.Next, "kubectl annotate pv "+strings.TrimPrefix(f.Object, "pv/")+" "+claims.ClaimsAnnotation+"-") {
			t.Errorf("finding %+v does not give the command that removes the annotation", f)
		}
	}
	done()

	done = tl.Step("fixed: fresh's annotation removed (nobody used it), data's restored")
	if err := annotatePV(ctx, c, pvs["fresh"], claims.ClaimsAnnotation, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 3*time.Minute, "fresh attached to node-b", framework.VolumeAttached(c, pvs["fresh"], "node-b", nil)); err != nil {
		t.Fatal(err)
	}
	if err := annotatePV(ctx, c, pvs["data"], claims.ClaimsAnnotation, &good); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "nothing counted malformed", malformed(0)); err != nil {
		t.Fatal(err)
	}
	if code, r := k.check(); code != 0 || !r.OK {
		t.Errorf("check after the fixes: exit %d, %+v", code, r)
	}
	done()

	// Skipped, not retried: the index logged no sync error for them.
	log, err := os.ReadFile(ctrl.Driver.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), `"syncing attachment index"`); n != 0 {
		t.Errorf("the driver logged %d \"syncing attachment index\" errors; an unreadable PV must be skipped, not retried", n)
	}
}
