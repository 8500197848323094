package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

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
