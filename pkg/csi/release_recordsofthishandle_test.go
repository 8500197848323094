package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A Release of one volume never takes another volume's release records
// for its own. It follows every PV a record of its node names, and a PV
// name is not an identity: the duplicate PV of a re-created Retained
// volume is deleted and a PV of another volume made under its name. The
// release leaves such a PV's claims alone (its handle check), but its
// records are handed out before that check (releaseIf calls `seen` first):
// the other volume's records of the node come back as this release's,
// its settle "retires" them on this volume's export and then removes them
// from the other volume's PV. That other volume's export change after its
// release (which makes a late open of the released attachment fail, or
// undoes it) was never made; with its record gone the leader's
// RetireMarked never makes it either: a late open of that released
// attachment stays until the minute's reconcile.
//
// Interleaving (node-a holds X and Y):
//  1. X has PVs p1 and p2; node-a's claim of X names both.
//  2. p2 is deleted; a PV named p2 is made for volume Y; Y is published
//     to node-a, then unpublished with the change after its release
//     failing (the RDS timed out): Y's record of node-a stays on p2 for
//     the leader.
//  3. X is unpublished from node-a: its record names p2, which it follows.
func TestReleaseLeavesAnotherVolumesRecordsAlone(t *testing.T) {
	a, b, client := newReviewReplicas(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const nameX = "pvc-35d00000-0000-4000-8000-000000000001"
	idX, pvs := twoPVVolume(t, a, b, client, nameX)
	p2 := nameX + "-recreated"
	if c := claimsOf(t, client, pvs[0])[nodeA]; len(c.PVs) != 2 {
		t.Fatalf("scripting: X's claim should name both PVs: %+v", c)
	}
	ctx := context.Background()
	if err := client.CoreV1().PersistentVolumes().Delete(ctx, p2, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replica to see the duplicate PV deleted", func() bool { return indexedPVs(a.index.Volume(idX)) == 1 })
	resp, err := a.cs.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-35d00000-0000-4000-8000-000000000002", VolumeCapabilities: []*csi.VolumeCapability{rwo}})
	if err != nil {
		t.Fatal(err)
	}
	idY := resp.Volume.VolumeId
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, testPV(p2, idY, corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitIndexed(idY)
	if _, err := a.publish(idY, nodeA, rwo); err != nil {
		t.Fatal(err)
	}
	failSwapAfter(a.rds, 2) // 1: the cut before Y's release; 2: the change after it
	err = a.unpublish(idY, nodeA)
	a.rds.mu.Lock()
	a.rds.atCall = nil
	a.rds.mu.Unlock()
	if err != nil {
		t.Fatalf("Y's unpublish (answered once its claim is gone): %v", err)
	}
	if len(retiringOf(t, client, p2)) != 1 {
		t.Fatalf("scripting: Y's record of node-a should stay on %s for the leader: %+v", p2, retiringOf(t, client, p2))
	}
	yAfterCut := a.disk(idY)

	if err := a.unpublish(idX, nodeA); err != nil {
		t.Fatalf("X's unpublish from node-a: %v", err)
	}
	if len(retiringOf(t, client, p2)) == 0 {
		if d := a.disk(idY); d.Exported == yAfterCut.Exported && d.AllowHost == yAfterCut.AllowHost {
			t.Errorf("X's unpublish removed volume %s's release record from PV %s (a name X's claim named), and %s's export change after that release was never made (still %q): the leader will not make it", idY, p2, idY, d.AllowHost)
		}
	}
}
