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

// A pod deleted while its node is down (the kubelet killed: the Node
// turns NotReady, its Lease goes silent, the containers keep running):
// nothing is detached while nobody can confirm the pod stopped; when the
// kubelet returns it stops the pod, unmounts and unstages the volume
// (the node keeps no mount and no device of it), the volume detaches,
// and a pod on the other node gets it with its data.
func TestPodDeletedWhileItsNodeIsDown(t *testing.T) {
	parallelLab(t, labShort)
	l := NewLab(t, LabOptions{})
	e := l.Env
	ns := framework.TestNamespace
	a, b := l.Nodes[0], l.Nodes[1]
	claim := framework.PVC(ns, "data", "rds-nvme-ext4", "64Mi", corev1.ReadWriteOnce, false)
	if _, err := e.Client.CoreV1().PersistentVolumeClaims(ns).Create(e.Ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := fsPod(ns, "app", "data", false, fsWriter)
	p.Spec.Affinity = onNode(a.Name)
	createPod(t, l, p)
	l.WaitPodReady(t, ns, "app", 5*time.Minute)
	waitLog(t, l, ns, "app", "written")
	pv := boundPV(t, l, ns, "data")
	if mi, err := a.MountInfo(); err != nil || !strings.Contains(mi, pv) {
		t.Fatalf("%s does not show %s mounted before the test (%v)", a.Name, pv, err)
	}

	a.StopKubelet(t)
	if _, err := framework.WaitFor(e.Ctx, e.TL, 2*time.Minute, a.Name+" not ready", framework.NodeReady(e.Client, a.Name, corev1.ConditionUnknown)); err != nil {
		t.Fatal(err)
	}
	if err := e.Client.CoreV1().Pods(ns).Delete(e.Ctx, "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Nobody confirms the pod stopped: it stays, Terminating, and the
	// volume stays attached to the node (checked once the deletion is
	// recorded; a detach now could cut a running writer).
	pod, err := e.Client.CoreV1().Pods(ns).Get(e.Ctx, "app", metav1.GetOptions{})
	if err != nil || pod.DeletionTimestamp == nil {
		t.Fatalf("the deleted pod: %v, %v", pod, err)
	}
	if nodes, err := framework.AttachedNodes(e.Ctx, e.Client, pv); err != nil || len(nodes) != 1 || nodes[0] != a.Name {
		t.Fatalf("%s attached to %v (%v) while %s is down, want %s", pv, nodes, err, a.Name, a.Name)
	}

	a.StartKubelet(t)
	deleted := func(ctx context.Context) (bool, string, error) {
		_, err := e.Client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		return err != nil, "the pod is still there", nil
	}
	if _, err := framework.WaitFor(e.Ctx, e.TL, 3*time.Minute, "the kubelet back on "+a.Name+" finishes the pod", deleted); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(e.Ctx, e.TL, 3*time.Minute, pv+" detached from "+a.Name, framework.NoVolumeAttachment(e.Client, pv, a.Name)); err != nil {
		t.Fatal(err)
	}
	if mi, err := a.MountInfo(); err != nil || strings.Contains(mi, pv) {
		t.Errorf("%s still has a mount of %s after the kubelet cleaned up (%v):\n%s", a.Name, pv, err, grepLines(mi, pv))
	}

	p2 := fsPod(ns, "app2", "data", false, fsWriter)
	p2.Spec.Affinity = onNode(b.Name)
	createPod(t, l, p2)
	l.WaitPodReady(t, ns, "app2", 5*time.Minute)
	waitLogAny(t, l, ns, "app2", "verified", "mismatch", "written")
	if out, _ := e.Client.CoreV1().Pods(ns).GetLogs("app2", &corev1.PodLogOptions{}).DoRaw(e.Ctx); !strings.Contains(string(out), "verified") {
		t.Errorf("the pod on %s does not find the data written on %s: %q", b.Name, a.Name, out)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
