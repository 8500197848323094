//go:build kubelet

package kubelet

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// A node that loses power (its kubelet, containerd and every container
// killed at once, its Lease silent) with storage fencing as the chart
// installs it (storageFencing.enabled: heartbeat fence, out-of-service
// taint): the StatefulSets' pods (a filesystem volume and a raw block
// volume, each with its checksummed pattern) come up on the other node
// unattended, and find their patterns intact.
func TestNodePowerLossMovesPodsWithTheirData(t *testing.T) {
	parallelLab(t, labShort)
	l := NewLab(t, LabOptions{Values: []string{"storageFencing.enabled=true"}})
	e := l.Env
	ns := framework.TestNamespace
	a, b := l.Nodes[0], l.Nodes[1]
	for _, s := range []string{"fs", "block"} {
		set := statefulSet(ns, s, "rds-nvme-ext4", fsWriter)
		if s == "block" {
			set = blockStatefulSet(ns, s, "rds-nvme-block", blockStatefulWriter)
		}
		if _, err := e.Client.AppsV1().StatefulSets(ns).Create(e.Ctx, preferNode(set, a.Name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, pod := range []string{"fs-0", "block-0"} {
		p := l.WaitPodReady(t, ns, pod, 5*time.Minute)
		if p.Spec.NodeName != a.Name {
			t.Fatalf("%s runs on %s, want %s", pod, p.Spec.NodeName, a.Name)
		}
		waitLog(t, l, ns, pod, "written")
	}

	a.PowerLoss(t)
	t0 := time.Now()
	for _, pod := range []string{"fs-0", "block-0"} {
		if _, err := framework.WaitFor(e.Ctx, e.TL, 5*time.Minute, pod+" ready on "+b.Name, func(ctx context.Context) (bool, string, error) {
			p, err := e.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			if p.Spec.NodeName != b.Name {
				return false, "on " + p.Spec.NodeName + ", " + string(p.Status.Phase), nil
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return true, "", nil
				}
			}
			return false, "on " + b.Name + ", " + string(p.Status.Phase) + "; " + l.events(ctx, ns, pod), nil
		}); err != nil {
			t.Fatal(err)
		}
		e.TL.Logf("%s ready on %s %s after the power loss", pod, b.Name, time.Since(t0).Round(100*time.Millisecond))
	}
	for _, pod := range []string{"fs-0", "block-0"} {
		waitLogAny(t, l, ns, pod, "verified", "mismatch", "written")
		out, err := e.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(e.Ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), "verified") {
			t.Errorf("%s on %s: the pattern written on %s does not check: %q", pod, b.Name, a.Name, out)
		}
	}
	// Unattended: the driver fenced the node on its heartbeat and tainted it.
	if _, err := framework.WaitFor(e.Ctx, e.TL, time.Minute, a.Name+" tainted out of service by the driver",
		framework.NodeTaint(e.Client, a.Name, "node.kubernetes.io/out-of-service", "", true)); err != nil {
		t.Error(err)
	}
}

// waitLogAny waits until a pod's log has any of lines.
func waitLogAny(t *testing.T, l *Lab, ns, pod string, lines ...string) {
	t.Helper()
	e := l.Env
	if _, err := framework.WaitFor(e.Ctx, e.TL, 2*time.Minute, ns+"/"+pod+" logs one of "+strings.Join(lines, ", "), func(ctx context.Context) (bool, string, error) {
		b, err := e.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, line := range lines {
			if strings.Contains(string(b), line) {
				return true, "", nil
			}
		}
		return false, string(b), nil
	}); err != nil {
		t.Fatal(err)
	}
}
