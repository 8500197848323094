//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/srvlab/rds-csi/e2e/framework"
)

var (
	snapshotGVR      = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	snapshotClassGVR = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}
)

// Through the real csi-resizer, csi-snapshotter and snapshot-controller:
// a claim grows (ControllerExpandVolume: the PV and the disk on the
// simulator), is snapshotted (a copy on the RDS), and a larger claim is
// restored from the snapshot with the original's content; deleting the
// snapshot and the claims removes every disk.
func TestExpandSnapshotRestore(t *testing.T) {
	t.Parallel()
	root := framework.EnsureBinaries(t)
	for _, b := range []string{"csi-resizer", "csi-snapshotter", "snapshot-controller"} {
		if !framework.HaveBinary(root, b) {
			t.Skipf("%s did not build (optional in hack/build-controlplane.sh; see .cache/build/status.tsv)", b)
		}
	}
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	sim := e.StartSim(framework.SimOptions{})
	e.NewNode("node-a")
	framework.InstallSnapshotCRDs(ctx, t, tl, e.CP)
	framework.StartSnapshotController(t, tl, e.CP, e.Dir)
	ctrl := e.StartController(sim, framework.ControllerOptions{NoAttacher: true})
	framework.StartResizer(t, tl, e.Root, e.Dir, ctrl.Driver, ctrl.Deployment, framework.SidecarOptions{})
	framework.StartSnapshotter(t, tl, e.Root, e.Dir, ctrl.Driver, ctrl.Deployment, framework.SidecarOptions{})
	dyn, err := dynamic.NewForConfig(e.CP.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := framework.TestNamespace

	done := tl.Step("provision a 1Gi block claim and write a marker into its disk")
	if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass("rds", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Raw block: the driver needs no node expansion, so the claim's own
	// capacity must reach 2Gi without a kubelet.
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, framework.PVC(ns, "data", "rds", "1Gi", corev1.ReadWriteOnce, true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pvName string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC data bound", framework.PVCBound(c, ns, "data", &pvName)); err != nil {
		t.Fatal(err)
	}
	disk, ok := sim.Disk(pvName)
	if !ok {
		t.Fatalf("no disk %s on the simulator", pvName)
	}
	marker := []byte("rds-csi e2e marker " + pvName)
	writeAt(t, disk.BackingFile, 1<<20, marker)
	done()

	done = tl.Step("expand the claim to 2Gi")
	pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC data capacity 2Gi", func(ctx context.Context) (bool, string, error) {
		pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		got := pvc.Status.Capacity[corev1.ResourceStorage]
		return got.Cmp(resource.MustParse("2Gi")) == 0, fmt.Sprintf("capacity %s conditions %v", got.String(), pvc.Status.Conditions), nil
	}); err != nil {
		t.Fatal(err)
	}
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("PV capacity %s after expansion, want 2Gi", got.String())
	}
	if d, _ := sim.Disk(pvName); d.Size != 2<<30 {
		t.Errorf("disk %s is %d bytes after expansion, want %d", pvName, d.Size, 2<<30)
	}
	done()

	done = tl.Step("snapshot the claim")
	class := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
		"metadata": map[string]any{"name": "rds"}, "driver": framework.DriverName, "deletionPolicy": "Delete",
	}}
	if _, err := dyn.Resource(snapshotClassGVR).Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	snap := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": "snap", "namespace": ns},
		"spec":     map[string]any{"volumeSnapshotClassName": "rds", "source": map[string]any{"persistentVolumeClaimName": "data"}},
	}}
	if _, err := dyn.Resource(snapshotGVR).Namespace(ns).Create(ctx, snap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var contentName string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "VolumeSnapshot snap readyToUse", func(ctx context.Context) (bool, string, error) {
		u, err := dyn.Resource(snapshotGVR).Namespace(ns).Get(ctx, "snap", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse")
		contentName, _, _ = unstructured.NestedString(u.Object, "status", "boundVolumeSnapshotContentName")
		status, _, _ := unstructured.NestedMap(u.Object, "status")
		return ready, fmt.Sprintf("status %v", status), nil
	}); err != nil {
		t.Fatal(err)
	}
	snapDisks := snapshotDisks(sim, pvName)
	if len(snapDisks) != 1 {
		t.Fatalf("snapshot disks of %s on the simulator: %v, want one", pvName, snapDisks)
	}
	tl.Logf("snapshot content %s is disk %s", contentName, snapDisks[0])
	done()

	done = tl.Step("restore the snapshot into a 3Gi claim")
	restore := framework.PVC(ns, "restored", "rds", "3Gi", corev1.ReadWriteOnce, true)
	restore.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap"}
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, restore, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var restoredPV string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC restored bound", framework.PVCBound(c, ns, "restored", &restoredPV)); err != nil {
		t.Fatal(err)
	}
	rd, ok := sim.Disk(restoredPV)
	if !ok {
		t.Fatalf("no disk %s on the simulator", restoredPV)
	}
	if rd.Size != 3<<30 {
		t.Errorf("restored disk %d bytes, want %d", rd.Size, 3<<30)
	}
	if got := readAt(t, rd.BackingFile, 1<<20, len(marker)); !bytes.Equal(got, marker) {
		t.Errorf("restored disk at 1MiB: %q, want the original's %q", got, marker)
	}
	done()

	done = tl.Step("delete the snapshot and both claims")
	if err := dyn.Resource(snapshotGVR).Namespace(ns).Delete(ctx, "snap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "snapshot disk removed from the simulator", func(context.Context) (bool, string, error) {
		d := snapshotDisks(sim, pvName)
		return len(d) == 0, fmt.Sprintf("snapshot disks %v", d), nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, claim := range []struct{ name, pv string }{{"data", pvName}, {"restored", restoredPV}} {
		if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, claim.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PV "+claim.pv+" deleted", framework.PVGone(c, claim.pv)); err != nil {
			t.Fatal(err)
		}
	}
	if disks := sim.Disks(); len(disks) != 0 {
		t.Errorf("disks left on the simulator: %+v", disks)
	}
	done()
}

// snapshotDisks are the simulator's disks in the snapshot directory whose
// file names say they were copied from volume.
func snapshotDisks(sim *framework.Sim, volume string) []string {
	var out []string
	for _, d := range sim.Disks() {
		if strings.HasPrefix(d.FilePath, framework.VolumePath+"/snapshots/") && strings.Contains(d.FilePath, ".src-"+volume+".") {
			out = append(out, d.Slot+" "+d.FilePath)
		}
	}
	return out
}

func writeAt(t *testing.T, path string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	return buf
}
