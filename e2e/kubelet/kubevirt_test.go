//go:build kubelet

package kubelet

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// What KubeVirt does with a VM's raw block disk, with real pods on real
// kubelets (three nodes, the chart as installed): a live migration opens
// the ReadWriteMany volume on a second node while the first still
// writes, a third node is refused while both hold it, and the target
// keeps the disk when the source goes; a VM restarted elsewhere is
// deleted and re-created on another node, and its disk is never attached
// to two nodes at once.
func TestRawBlockVolumesMoveAsKubeVirtMovesVMs(t *testing.T) {
	parallelLab(t, labShort)
	l := NewLab(t, LabOptions{Nodes: 3})
	e := l.Env
	ns := framework.TestNamespace
	mon, err := framework.WatchAttachments(e.Ctx, e.Client)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := l.Nodes[0].Name, l.Nodes[1].Name, l.Nodes[2].Name

	t.Run("live migration: a second node opens the volume while the first writes, a third is refused", func(t *testing.T) {
		claim := framework.PVC(ns, "migrating", "rds-nvme-block", "64Mi", corev1.ReadWriteMany, true)
		if _, err := e.Client.CoreV1().PersistentVolumeClaims(ns).Create(e.Ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// The source "VM" writes an increasing counter to the disk's first
		// block, synced, as long as it runs.
		createPod(t, l, blockPodOn(ns, "source", "migrating", a, counterWriter))
		l.WaitPodReady(t, ns, "source", 5*time.Minute)
		pv := boundPV(t, l, ns, "migrating")
		// The target on another node opens the same disk while the source
		// writes, and sees the source's writes arrive.
		createPod(t, l, blockPodOn(ns, "target", "migrating", b, "exec sleep 100000"))
		l.WaitPodReady(t, ns, "target", 5*time.Minute)
		first := readCounter(t, l, ns, "target")
		if _, err := framework.WaitFor(e.Ctx, e.TL, time.Minute, "the target reads the source's newer writes", func(context.Context) (bool, string, error) {
			now := readCounter(t, l, ns, "target")
			return now > first, fmt.Sprintf("counter %d, first read %d", now, first), nil
		}); err != nil {
			t.Fatal(err)
		}
		// A third node while two hold it: refused, the pod waits.
		createPod(t, l, blockPodOn(ns, "third", "migrating", c, "exec sleep 100000"))
		if _, err := framework.WaitFor(e.Ctx, e.TL, 3*time.Minute, "the third node's attach refused", attachRefused(l, pv, c)); err != nil {
			t.Fatal(err)
		}
		if n := mon.MaxAttached(pv); n != 2 {
			t.Errorf("%s was attached to %d nodes at most, want 2 (source and target)", pv, n)
		}
		// The migration ends: the source goes. The target keeps the disk
		// and writes to it.
		deletePod(t, l, ns, "source")
		if out, err := l.Exec(ns, "target", "sh", "-c", "echo 999999999 | dd of=/dev/xvda bs=512 count=1 conv=sync,fsync 2>/dev/null && dd if=/dev/xvda bs=512 count=1 2>/dev/null | tr -dc 0-9"); err != nil || out != "999999999" {
			t.Errorf("the target cannot write its disk after the source left: %q %v", out, err)
		}
		if n := mon.MaxAttached(pv); n != 2 {
			t.Errorf("%s was attached to %d nodes at most, want 2", pv, n)
		}
		// The lab's loop connector gives lab nodes on one kernel one loop
		// device per volume, so node-a's unstage of the source ends only
		// once the target's node lets go of that device too (on real
		// nodes each has its own NVMe/TCP connection): the detach of the
		// source is not waited for here. The target and the refused pod
		// go; every attachment of the volume then ends.
		deletePod(t, l, ns, "target")
		deletePod(t, l, ns, "third")
		for _, n := range []string{a, b, c} {
			if _, err := framework.WaitFor(e.Ctx, e.TL, 3*time.Minute, pv+" detached from "+n, framework.NoVolumeAttachment(e.Client, pv, n)); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("restart elsewhere: deleted on one node, re-created on another, never attached to both", func(t *testing.T) {
		claim := framework.PVC(ns, "vmdisk", "rds-nvme-block", "64Mi", corev1.ReadWriteOnce, true)
		if _, err := e.Client.CoreV1().PersistentVolumeClaims(ns).Create(e.Ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		createPod(t, l, blockPodOn(ns, "vm", "vmdisk", a, blockStatefulWriter))
		l.WaitPodReady(t, ns, "vm", 5*time.Minute)
		waitLog(t, l, ns, "vm", "written")
		pv := boundPV(t, l, ns, "vmdisk")
		// KubeVirt's restart: the launcher pod is deleted and a new one
		// created at once, here on another node.
		if err := e.Client.CoreV1().Pods(ns).Delete(e.Ctx, "vm", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		createPod(t, l, blockPodOn(ns, "vm-restarted", "vmdisk", b, blockStatefulWriter))
		l.WaitPodReady(t, ns, "vm-restarted", 5*time.Minute)
		waitLogAny(t, l, ns, "vm-restarted", "verified", "mismatch", "written")
		if out, _ := e.Client.CoreV1().Pods(ns).GetLogs("vm-restarted", &corev1.PodLogOptions{}).DoRaw(e.Ctx); !strings.Contains(string(out), "verified") {
			t.Errorf("the restarted VM on %s does not find the disk written on %s: %q", b, a, out)
		}
		e.TL.Logf("restarted on %s with its disk %s after the delete", b, time.Since(t0).Round(100*time.Millisecond))
		if n := mon.MaxAttached(pv); n != 1 {
			t.Errorf("%s (ReadWriteOnce) was attached to %d nodes at once", pv, n)
		}
		if d, ok := mon.Handoff(pv, a, b); ok {
			e.TL.Logf("handoff %s -> %s: %s between the detach and the attach", a, b, d.Round(time.Millisecond))
		}
		deletePod(t, l, ns, "vm-restarted")
	})
}

// counterWriter writes an increasing number, synced, to the disk's first
// 512 bytes, five times a second.
const counterWriter = `i=0
while true; do
  i=$((i+1))
  echo $i | dd of=/dev/xvda bs=512 count=1 conv=sync,fsync 2>/dev/null
  sleep 0.2
done`

// blockPodOn is a busybox pod on node (through node affinity: the
// scheduler still places it) with claim as a raw block device at
// /dev/xvda, running script.
func blockPodOn(ns, name, claim, node, script string) *corev1.Pod {
	p := blockPod(ns, name, claim)
	p.Spec.Containers[0].Command = []string{"sh", "-c", script}
	p.Spec.Affinity = onNode(node)
	return p
}

func onNode(node string) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}}
}

func createPod(t *testing.T, l *Lab, p *corev1.Pod) {
	t.Helper()
	if _, err := l.Env.Client.CoreV1().Pods(p.Namespace).Create(l.Env.Ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// deletePod deletes a pod and waits until it is gone (its kubelet
// confirmed it).
func deletePod(t *testing.T, l *Lab, ns, name string) {
	t.Helper()
	e := l.Env
	if err := e.Client.CoreV1().Pods(ns).Delete(e.Ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(e.Ctx, e.TL, 3*time.Minute, "pod "+name+" gone", func(ctx context.Context) (bool, string, error) {
		_, err := e.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return false, "still there", nil
		}
		return true, "", nil
	}); err != nil {
		t.Fatal(err)
	}
}

// boundPV is the PV a claim is bound to.
func boundPV(t *testing.T, l *Lab, ns, claim string) string {
	t.Helper()
	var pv string
	if _, err := framework.WaitFor(l.Env.Ctx, l.Env.TL, time.Minute, claim+" bound", framework.PVCBound(l.Env.Client, ns, claim, &pv)); err != nil {
		t.Fatal(err)
	}
	return pv
}

// readCounter reads the number at the start of a pod's /dev/xvda.
func readCounter(t *testing.T, l *Lab, ns, pod string) int {
	t.Helper()
	out, err := l.Exec(ns, pod, "sh", "-c", "dd if=/dev/xvda bs=512 count=1 2>/dev/null | tr -dc 0-9")
	if err != nil {
		t.Fatalf("reading the counter in %s: %v %s", pod, err, out)
	}
	var n int
	fmt.Sscan(out, &n)
	return n
}

// attachRefused holds when node's VolumeAttachment of pv exists, is not
// attached and carries the driver's refusal.
func attachRefused(l *Lab, pv, node string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		vas, err := framework.VolumeAttachmentsFor(ctx, l.Env.Client, pv)
		if err != nil {
			return false, err.Error(), nil
		}
		for _, va := range vas {
			if va.Spec.NodeName != node {
				continue
			}
			if va.Status.Attached {
				return false, "", fmt.Errorf("%s attached to %s, a third node, while two held it", pv, node)
			}
			if va.Status.AttachError == nil {
				return false, "VolumeAttachment " + va.Name + " pending", nil
			}
			l.Env.TL.Logf("%s refused on %s: %s", pv, node, va.Status.AttachError.Message)
			return true, "", nil
		}
		return false, "no VolumeAttachment for " + node, nil
	}
}
