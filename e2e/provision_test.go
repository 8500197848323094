//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// A claim is provisioned by csi-provisioner through the driver's
// CreateVolume into a disk on the simulator, bound, and its deletion
// removes the disk and its backing file; a claim the driver cannot serve
// (RWX filesystem) stays Pending with the driver's reason and leaves
// nothing on the RDS.
func TestProvisionAndDelete(t *testing.T) {
	t.Parallel()
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, c, tl := e.Ctx, e.Client, e.TL
	sim := e.StartSim(framework.SimOptions{})
	// csi-provisioner runs with topology on: it needs a node whose CSINode
	// lists the driver before it provisions anything.
	e.NewNode("node-a")
	e.StartController(sim, framework.ControllerOptions{})

	done := tl.Step("StorageClass + 1Gi RWO PVC")
	if _, err := c.StorageV1().StorageClasses().Create(ctx, framework.StorageClass("rds", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Create(ctx,
		framework.PVC(framework.TestNamespace, "data", "rds", "1Gi", corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pvName string
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PVC e2e/data bound", framework.PVCBound(c, framework.TestNamespace, "data", &pvName)); err != nil {
		t.Fatal(err)
	}
	done()

	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != framework.DriverName {
		t.Fatalf("PV %s is not a %s volume: %+v", pvName, framework.DriverName, pv.Spec.PersistentVolumeSource)
	}
	handle := pv.Spec.CSI.VolumeHandle
	if handle != pvName {
		t.Errorf("volume handle %q, want the PV name %q (pvc-<uid> names are kept as volume IDs)", handle, pvName)
	}
	if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("PV capacity %s, want 1Gi", got.String())
	}
	if err := checkTopology(pv); err != nil {
		t.Error(err)
	}

	disk, ok := sim.Disk(handle)
	if !ok {
		t.Fatalf("no disk %s on the simulator; disks: %+v", handle, sim.Disks())
	}
	if want := path.Join(framework.VolumePath, handle+".img"); disk.FilePath != want {
		t.Errorf("disk file %q, want %q", disk.FilePath, want)
	}
	if disk.Size != 1<<30 {
		t.Errorf("disk size %d, want %d", disk.Size, 1<<30)
	}
	if st, err := os.Stat(disk.BackingFile); err != nil || st.Size() != 1<<30 {
		t.Errorf("backing file %s: %v, size %d", disk.BackingFile, err, sizeOf(st))
	}
	tl.Logf("simulator has disk %s: file %s, %d bytes, exported=%t", disk.Slot, disk.FilePath, disk.Size, disk.NVMeTCPExport)

	done = tl.Step("RWX filesystem PVC is refused by the driver")
	if _, err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Create(ctx,
		framework.PVC(framework.TestNamespace, "rwx-fs", "rds", "1Gi", corev1.ReadWriteMany, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "ProvisioningFailed event on PVC e2e/rwx-fs", provisioningFailed(e, "rwx-fs")); err != nil {
		t.Fatal(err)
	}
	pvc, err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Get(ctx, "rwx-fs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending {
		t.Errorf("PVC rwx-fs phase %s, want Pending", pvc.Status.Phase)
	}
	if disks := sim.Disks(); len(disks) != 1 || disks[0].Slot != handle {
		t.Errorf("simulator disks after the refused claim: %+v, want only %s", disks, handle)
	}
	if err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Delete(ctx, "rwx-fs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	done()

	done = tl.Step("delete the PVC")
	if err := c.CoreV1().PersistentVolumeClaims(framework.TestNamespace).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, 2*time.Minute, "PV "+pvName+" deleted", framework.PVGone(c, pvName)); err != nil {
		t.Fatal(err)
	}
	// csi-provisioner deletes the PV only after DeleteVolume succeeded, so
	// the disk must already be gone: no waiting here.
	if d, ok := sim.Disk(handle); ok {
		t.Errorf("disk %s still on the simulator after its PV was deleted: %+v", handle, d)
	}
	if _, err := os.Stat(disk.BackingFile); !os.IsNotExist(err) {
		t.Errorf("backing file %s still there after DeleteVolume (stat: %v)", disk.BackingFile, err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "PVC e2e/data gone", framework.PVCGone(c, framework.TestNamespace, "data")); err != nil {
		t.Fatal(err)
	}
	done()
}

// checkTopology: the PV must be reachable exactly where the RDS is, i.e.
// its node affinity names the driver's topology key with the RDS's name.
func checkTopology(pv *corev1.PersistentVolume) error {
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) == 0 {
		return fmt.Errorf("PV %s has no node affinity; want %s=%s", pv.Name, framework.TopologyKey, framework.RDSName)
	}
	for _, term := range na.Required.NodeSelectorTerms {
		for _, r := range term.MatchExpressions {
			if r.Key == framework.TopologyKey && r.Operator == corev1.NodeSelectorOpIn && len(r.Values) == 1 && r.Values[0] == framework.RDSName {
				return nil
			}
		}
	}
	return fmt.Errorf("PV %s node affinity %+v does not require %s=%s", pv.Name, na.Required.NodeSelectorTerms, framework.TopologyKey, framework.RDSName)
}

func provisioningFailed(e *framework.Env, claim string) framework.Condition {
	return func(ctx context.Context) (bool, string, error) {
		evs, err := e.Client.CoreV1().Events(framework.TestNamespace).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=" + claim,
		})
		if err != nil {
			return false, err.Error(), nil
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Reason == "ProvisioningFailed" {
				e.TL.Logf("PVC %s: %s: %s", claim, ev.Reason, ev.Message)
				return true, "", nil
			}
			seen = append(seen, ev.Reason)
		}
		return false, fmt.Sprintf("events %v", seen), nil
	}
}

func sizeOf(st os.FileInfo) int64 {
	if st == nil {
		return -1
	}
	return st.Size()
}
