package csi

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// A volume whose holder was answered OK and whose export is then closed
// (a compare-and-swap of a step that lost its claim, an operator) is
// INACCESSIBLE in ControllerGetVolumeHealth and ControllerListVolumeHealth,
// naming the holder and what the reconcile does; open to the holder it is
// healthy.
func TestVolumeHealthShowsAHolderShutOut(t *testing.T) {
	client := newFakeAPI(testNode(nodeA), testNode(nodeB))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000601", corev1.ReadWriteOnce, false)
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(id, nodeA)
	health := func() ([]*csi.VolumeHealth_VolumeHealthEntry, []*csi.VolumeHealth) {
		t.Helper()
		got, err := e.cs.ControllerGetVolumeHealth(context.Background(), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
		if err != nil {
			t.Fatal(err)
		}
		list, err := e.cs.ControllerListVolumeHealth(context.Background(), &csi.ControllerListVolumeHealthRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return got.GetVolumeHealth().GetHealthStatuses(), list.GetEntries()
	}
	if one, all := health(); len(one) != 0 || len(all) != 0 {
		t.Fatalf("open to its holder: health %v, list %v; want healthy", one, all)
	}
	d := e.disk(id)
	tomb := rds.ExportState{Host: "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000dead"}
	if _, err := e.rds.SwapExport(context.Background(), id, rds.StateOf(&d), tomb); err != nil {
		t.Fatal(err)
	}
	one, all := health()
	if len(one) != 1 || one[0].GetStatus() != csi.VolumeHealthErrorType_INACCESSIBLE ||
		!strings.Contains(one[0].GetMessage(), nodeA) || !strings.Contains(one[0].GetMessage(), "reconcile") {
		t.Fatalf("closed under its holder: health %v; want one INACCESSIBLE entry naming %s and the reconcile", one, nodeA)
	}
	if len(all) != 1 || all[0].GetVolumeId() != id {
		t.Fatalf("closed under its holder: list %v; want the volume", all)
	}

	// A live migration: open to the target, the source keeps its
	// connection; healthy.
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	mig := e.newVolume(client, "pvc-5f000000-0000-4000-8000-000000000607", corev1.ReadWriteMany, true)
	for _, n := range []string{nodeA, nodeB} {
		if _, err := e.publish(mig, n, rwx); err != nil {
			t.Fatal(err)
		}
	}
	e.waitClaims(mig, nodeA, nodeB)
	got, err := e.cs.ControllerGetVolumeHealth(context.Background(), &csi.ControllerGetVolumeHealthRequest{VolumeId: mig})
	if err != nil || len(got.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Fatalf("a live migration: health %v (%v); want healthy", got.GetVolumeHealth().GetHealthStatuses(), err)
	}
}

// Under storage fencing too, a volume whose export is open to its holder
// but on another port or NQN than nodes connect to is INACCESSIBLE
// (ExportMismatch): the holder is let in, but at an address its node
// does not dial. Volume health reported it before HolderShutOut; since,
// exportHealth under storage fencing asks only whether the holder is let
// in, and the address check is skipped.
func TestVolumeHealthUnderStorageFencingShowsAnExportOnAnotherAddress(t *testing.T) {
	client := newFakeAPI(testNode(nodeA))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-35e00000-0000-4000-8000-000000000001", corev1.ReadWriteOnce, false)
	if _, err := e.publish(id, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	e.waitClaims(id, nodeA)
	e.rds.mu.Lock()
	d := e.rds.disks[id]
	d.NQN = "nqn.2000-02.com.mikrotik:other"
	e.rds.disks[id] = d
	e.rds.mu.Unlock()

	got, err := e.cs.ControllerGetVolumeHealth(context.Background(), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	h := got.GetVolumeHealth().GetHealthStatuses()
	if len(h) != 1 || h[0].GetReason() != HealthExportMismatch {
		t.Fatalf("open to its holder under NQN %q (nodes connect to %q): health %v; want one %s entry", d.NQN, e.cs.d.nqn(id), h, HealthExportMismatch)
	}
}
