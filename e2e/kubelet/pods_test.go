//go:build kubelet

package kubelet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// The script of a writer: a checksummed pattern of 8 MiB on the volume,
// written once and synced ("written"); a pod that finds it (a replacement
// elsewhere) checks it instead ("verified", or "mismatch"). Then it stays
// up.
const fsWriter = `set -e
if [ -f /data/pattern.sha256 ]; then
  if sha256sum -c /data/pattern.sha256 >/dev/null 2>&1; then echo verified; else echo mismatch; fi
else
  dd if=/dev/urandom of=/data/pattern bs=1M count=8 2>/dev/null
  sync
  sha256sum /data/pattern > /data/pattern.sha256
  sync
  echo written
fi
exec sleep 100000`

// The same on a raw block device: the pattern in its first 8 MiB, the
// pattern's sum at 8 MiB.
const blockStatefulWriter = `set -e
dev=/dev/xvda
stored=$(dd if=$dev bs=1M skip=8 count=1 2>/dev/null | head -c 64 | tr -dc 0-9a-f)
if [ ${#stored} -eq 64 ]; then
  now=$(dd if=$dev bs=1M count=8 2>/dev/null | sha256sum | cut -d' ' -f1)
  if [ "$now" = "$stored" ]; then echo verified; else echo "mismatch"; fi
else
  dd if=/dev/urandom of=/tmp/pattern bs=1M count=8 2>/dev/null
  dd if=/tmp/pattern of=$dev bs=1M conv=fsync 2>/dev/null
  sha256sum /tmp/pattern | cut -d' ' -f1 | tr -d '\\n' | dd of=$dev bs=1M seek=8 conv=fsync 2>/dev/null
  echo written
fi
exec sleep 100000`

// The raw block writer: the pattern on the device's first 8 MiB, its sum
// in the pod's own /tmp.
const blockWriter = `set -e
dd if=/dev/urandom of=/tmp/pattern bs=1M count=8 2>/dev/null
dd if=/tmp/pattern of=/dev/xvda bs=1M conv=fsync 2>/dev/null
sha256sum /tmp/pattern | cut -d' ' -f1 > /tmp/sum
echo written
exec sleep 100000`

// The chart as shipped on real kubelets: node-driver-registrar's stand-in
// registers the plugin with each kubelet (CSINode), the controller's
// replicas come up with their sidecars, and the kubelet stages and
// publishes volumes for pods: a StatefulSet's RWO filesystem volume and a
// raw block volume each take a checksummed pattern that reads back the
// same through the pod and, for the block volume, in the RDS's backing
// file itself.
func TestChartOnRealKubelets(t *testing.T) {
	parallelLab(t, labShort)
	l := NewLab(t, LabOptions{})
	e := l.Env
	ns := framework.TestNamespace

	if _, err := e.Client.AppsV1().StatefulSets(ns).Create(e.Ctx, statefulSet(ns, "fs", "rds-nvme-ext4", fsWriter), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	blockPVC := framework.PVC(ns, "block", "rds-nvme-block", "64Mi", corev1.ReadWriteOnce, true)
	if _, err := e.Client.CoreV1().PersistentVolumeClaims(ns).Create(e.Ctx, blockPVC, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Client.CoreV1().Pods(ns).Create(e.Ctx, blockPod(ns, "block", "block"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	l.WaitPodReady(t, ns, "fs-0", 5*time.Minute)
	l.WaitPodReady(t, ns, "block", 5*time.Minute)
	waitLog(t, l, ns, "fs-0", "written")
	waitLog(t, l, ns, "block", "written")

	if out, err := l.Exec(ns, "fs-0", "sha256sum", "-c", "/data/pattern.sha256"); err != nil || !strings.Contains(out, "OK") {
		t.Errorf("the filesystem pattern does not check: %v\n%s", err, out)
	}
	sum, err := l.Exec(ns, "block", "cat", "/tmp/sum")
	if err != nil {
		t.Fatalf("reading the block pod's sum: %v\n%s", err, sum)
	}
	sum = strings.TrimSpace(sum)
	back, err := l.Exec(ns, "block", "sh", "-c", "dd if=/dev/xvda bs=1M count=8 2>/dev/null | sha256sum | cut -d' ' -f1")
	if err != nil || strings.TrimSpace(back) != sum {
		t.Errorf("the block device reads back %q, the pod wrote %q (%v)", strings.TrimSpace(back), sum, err)
	}
	// On the RDS: the disk's backing file holds the pattern.
	var pv string
	if _, err := framework.WaitFor(e.Ctx, e.TL, time.Minute, "block claim bound", framework.PVCBound(e.Client, ns, "block", &pv)); err != nil {
		t.Fatal(err)
	}
	if got := fileSum(t, l, pv, 8<<20); got != sum {
		t.Errorf("the RDS's file of %s holds %s in its first 8 MiB, the pod wrote %s", pv, got, sum)
	}
}

func blockPod(ns, name, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptrTo(int64(5)),
			Containers: []corev1.Container{{
				Name: "app", Image: busybox, Command: []string{"sh", "-c", blockWriter},
				VolumeDevices: []corev1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
}

// waitLog waits until a pod's log (through the API server and the
// kubelet) has line.
func waitLog(t *testing.T, l *Lab, ns, pod, line string) {
	t.Helper()
	e := l.Env
	if _, err := framework.WaitFor(e.Ctx, e.TL, 2*time.Minute, fmt.Sprintf("%s/%s logs %q", ns, pod, line), func(ctx context.Context) (bool, string, error) {
		b, err := e.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		return strings.Contains(string(b), line), string(b), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// fileSum is the sha256 of the first n bytes of the simulator's backing
// file of volume pv.
func fileSum(t *testing.T, l *Lab, pv string, n int64) string {
	t.Helper()
	pvo, err := l.Env.Client.CoreV1().PersistentVolumes().Get(l.Env.Ctx, pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d, ok := l.Sim.Disk(pvo.Spec.CSI.VolumeHandle)
	if !ok {
		t.Fatalf("the simulator has no disk %s", pvo.Spec.CSI.VolumeHandle)
	}
	f, err := os.Open(d.BackingFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, n); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
