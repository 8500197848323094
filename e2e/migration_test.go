//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// migrationTimeout is the driver's --migration-timeout in this scenario:
// short, so the test sees it pass.
const migrationTimeout = 20 * time.Second

// Scenario 5: raw-block ReadWriteMany live migration (KubeVirt). A Block
// RWX claim is attached to node-a (the VM's source) and node-b (the
// migration target) at once; a third node is refused by the driver's
// FAILED_PRECONDITION naming both holders. The migration timeout is
// enforced on re-publish: csi-attacher publishes again when a
// VolumeAttachment is marked not attached (as it does when it loses track
// of an attachment), so the test keeps re-publishing node-b's attachment
// until the driver refuses it. Every re-publish before the timeout is
// accepted; the refusal comes no earlier than --migration-timeout after
// node-b started holding the volume, names the timeout, and is for the
// newer holder only: node-a's re-publish is still accepted. Once node-a's
// pod goes (the migration completes), csi-attacher's next retry attaches
// node-b alone.
func TestRawBlockLiveMigration(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	ns := framework.TestNamespace
	sim := e.StartSim(framework.SimOptions{})
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		e.NewNode(n)
	}
	mon, err := framework.WatchAttachments(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	e.StartController(sim, framework.ControllerOptions{DriverArgs: []string{"--migration-timeout=" + migrationTimeout.String()}})

	done := tl.Step("StorageClass rds-block + 1Gi Block RWX PVC e2e/vm-disk")
	if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass("rds-block", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx,
		framework.PVC(ns, "vm-disk", "rds-block", "1Gi", corev1.ReadWriteMany, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pvName string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC e2e/vm-disk bound", framework.PVCBound(c, ns, "vm-disk", &pvName)); err != nil {
		t.Fatal(err)
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.VolumeMode == nil || *pv.Spec.VolumeMode != corev1.PersistentVolumeBlock {
		t.Fatalf("PV %s volumeMode %v, want Block", pvName, pv.Spec.VolumeMode)
	}
	handle := pv.Spec.CSI.VolumeHandle
	if _, ok := sim.Disk(handle); !ok {
		t.Fatalf("no disk %s on the simulator", handle)
	}
	done()

	done = tl.Step("virt-launcher pods on node-a (source) and node-b (target)")
	var vaA, vaB storagev1.VolumeAttachment
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.BlockPodOnNode(ns, "vm-source", "node-a", "vm-disk"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "volume attached to node-a", framework.VolumeAttached(c, pvName, "node-a", &vaA)); err != nil {
		t.Fatal(err)
	}
	// The driver tells source from target by when each started holding
	// the volume, with one-second resolution; a target started in the same
	// second as the source ties with it (both then count as the target,
	// see pkg/fencing's tests). A migration target starts after its
	// source runs: wait for the clock to leave the source's second.
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "the clock past the second node-a's attachment was created in",
		func(context.Context) (bool, string, error) {
			return time.Now().Truncate(time.Second).After(vaA.CreationTimestamp.Time), "", nil
		}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.BlockPodOnNode(ns, "vm-target", "node-b", "vm-disk"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "volume attached to node-b", framework.VolumeAttached(c, pvName, "node-b", &vaB)); err != nil {
		t.Fatal(err)
	}
	if !vaB.CreationTimestamp.After(vaA.CreationTimestamp.Time) {
		t.Fatalf("node-b's VolumeAttachment created at %s, not after node-a's at %s", vaB.CreationTimestamp, vaA.CreationTimestamp)
	}
	if nodes, err := framework.AttachedNodes(ctx, c, pvName); err != nil || len(nodes) != 2 {
		t.Fatalf("attached nodes %v (%v), want node-a and node-b", nodes, err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "claims name node-a and node-b", framework.ClaimsAre(c, pvName, "node-a", "node-b")); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "LiveMigrationStarted event on the PVC",
		framework.EventOn(c, ns, "PersistentVolumeClaim", "vm-disk", framework.ReasonMigrationStarted, nil, "node-a", "node-b")); err != nil {
		t.Error(err)
	}
	done()

	done = tl.Step("a third pod on node-c is refused")
	if _, err := c.CoreV1().Pods(ns).Create(ctx, framework.BlockPodOnNode(ns, "vm-third", "node-c", "vm-disk"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var vaC storagev1.VolumeAttachment
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "node-c's VolumeAttachment refused by the driver",
		framework.AttachRefused(c, pvName, "node-c", &vaC, "FailedPrecondition", "node-a", "node-b", "two nodes at most")); err != nil {
		t.Fatal(err)
	}
	tl.Logf("node-c attach error: %s", vaC.Status.AttachError.Message)
	if err := framework.NotAttachedTo(ctx, c, pvName, handle, "node-c"); err != nil {
		t.Error(err)
	}
	if err := framework.ForceDeletePod(ctx, c, ns, "vm-third"); err != nil {
		t.Fatal(err)
	}
	// node-c's kubelet reports, in its node status, that it does not use
	// the volume; only then does the attach/detach controller detach the
	// refused attachment and delete its VolumeAttachment (until then
	// csi-attacher keeps retrying it, and it would attach as soon as the
	// volume had fewer than two holders). Like a kubelet, the test posts
	// the status again every few seconds until that happened.
	var reported time.Time
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-c's VolumeAttachment gone", func(ctx context.Context) (bool, string, error) {
		done, state, err := framework.NoVolumeAttachment(c, pvName, "node-c")(ctx)
		if done || err != nil || time.Since(reported) < 2*time.Second {
			return done, state, err
		}
		reported = time.Now()
		if err := framework.ReportNodeStatus(ctx, c, "node-c"); err != nil {
			return false, err.Error(), nil
		}
		return false, state + "; node-c status posted", nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 10*time.Second, "claims still name node-a and node-b", framework.ClaimsAre(c, pvName, "node-a", "node-b")); err != nil {
		t.Error(err)
	}
	done()

	done = tl.Step(fmt.Sprintf("re-publish node-b until the driver refuses it (--migration-timeout=%s)", migrationTimeout))
	// node-b holds the volume from its VolumeAttachment's creation or its
	// claim, whichever is earlier (both have one-second resolution and
	// are rounded down, so this is no later than the driver's value).
	sinceB := vaB.CreationTimestamp.Time
	claims, err := framework.Claims(ctx, c, pvName)
	if err != nil {
		t.Fatal(err)
	}
	if at, err := time.Parse(time.RFC3339, claims["node-b"]); err == nil && at.Before(sinceB) {
		sinceB = at
	}
	var (
		accepted    int
		lastForced  time.Time
		refusedVA   storagev1.VolumeAttachment
		refusalSeen time.Time
	)
	_, err = framework.WaitFor(ctx, tl, migrationTimeout+2*time.Minute, "node-b's re-publish refused for the migration timeout",
		func(ctx context.Context) (bool, string, error) {
			va, err := framework.AttachmentFor(ctx, c, pvName, "node-b")
			if err != nil || va == nil {
				return false, fmt.Sprintf("node-b's VolumeAttachment: %v %v", va, err), nil
			}
			switch {
			case va.Status.Attached:
				// Accepted (or not re-published yet): publish again, at
				// most every 2 s so the driver's log stays readable.
				if time.Since(lastForced) < 2*time.Second {
					return false, "attached", nil
				}
				if !lastForced.IsZero() {
					accepted++
				}
				if err := framework.RepublishAttachment(ctx, c, va.Name); err != nil {
					return false, err.Error(), nil
				}
				lastForced = time.Now()
				return false, fmt.Sprintf("attached; re-publish #%d asked", accepted+1), nil
			case va.Status.AttachError != nil && strings.Contains(va.Status.AttachError.Message, "migration timeout"):
				refusedVA, refusalSeen = *va, time.Now()
				return true, "", nil
			case va.Status.AttachError != nil:
				return false, "", fmt.Errorf("node-b's re-publish failed for another reason: %s", va.Status.AttachError.Message)
			}
			return false, "re-publish in progress", nil
		})
	if err != nil {
		t.Fatal(err)
	}
	msg := refusedVA.Status.AttachError.Message
	tl.Logf("node-b refused after %d accepted re-publishes, %s after it started holding the volume: %s",
		accepted, refusalSeen.Sub(sinceB).Round(time.Millisecond), msg)
	for _, s := range []string{"FailedPrecondition", "node-a", "node-b", "longer than the migration timeout of " + migrationTimeout.String()} {
		if !strings.Contains(msg, s) {
			t.Errorf("node-b's refusal %q lacks %q", msg, s)
		}
	}
	// A lower bound only: the refusal cannot have been decided before the
	// timeout passed, however slow the machine.
	if refusalSeen.Before(sinceB.Add(migrationTimeout)) {
		t.Errorf("node-b refused %s after it started holding the volume, before the migration timeout of %s", refusalSeen.Sub(sinceB), migrationTimeout)
	}
	done()

	done = tl.Step("node-a (the older holder) may still re-publish")
	if err := framework.RepublishAttachment(ctx, c, vaA.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-a's re-publish accepted", attachedAgain(c, pvName, "node-a")); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("the source pod goes: node-b alone")
	if err := framework.ForceDeletePod(ctx, c, ns, "vm-source"); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "node-a's VolumeAttachment gone", framework.NoVolumeAttachment(c, pvName, "node-a")); err != nil {
		t.Fatal(err)
	}
	// csi-attacher retries node-b's refused publish (backoff capped at
	// 5 s); with one holder left it is accepted.
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "volume attached to node-b again", framework.VolumeAttached(c, pvName, "node-b", nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "claims name node-b only", framework.ClaimsAre(c, pvName, "node-b")); err != nil {
		t.Error(err)
	}
	done()

	if got := mon.MaxAttached(pvName); got != 2 {
		t.Errorf("PV %s was attached to at most %d nodes at once, want 2 (node-a and node-b); history %+v", pvName, got, mon.History(pvName))
	}
	for _, h := range mon.History(pvName) {
		for _, n := range h.Nodes {
			if n == "node-c" {
				t.Errorf("PV %s was attached to node-c at %s: %v", pvName, h.At.Format(time.RFC3339Nano), h.Nodes)
			}
		}
	}
}

// attachedAgain holds when node's VolumeAttachment is attached; an attach
// error on it ends the wait (the re-publish was refused).
func attachedAgain(c kubernetes.Interface, pvName, node string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		va, err := framework.AttachmentFor(ctx, c, pvName, node)
		if err != nil || va == nil {
			return false, fmt.Sprintf("%s's VolumeAttachment: %v %v", node, va, err), nil
		}
		if e := va.Status.AttachError; e != nil && !va.Status.Attached {
			return false, "", fmt.Errorf("%s's re-publish refused: %s", node, e.Message)
		}
		return va.Status.Attached, "not attached yet", nil
	}
}
