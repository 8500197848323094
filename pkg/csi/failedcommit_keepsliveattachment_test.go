package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/srvlab/rds-csi/pkg/claims"
)

// A repeated publish of a live attachment whose commit fails part-way
// leaves that attachment standing: what a failed commit takes back is a
// claim it made for a NEW attachment (its own nonce, answered to no one).
// The same attachment written to a PV that did not show it yet (a PV made
// for the handle while the volume is attached) is not new: taking it back
// there writes a release record (rds.csi.srvlab.io/retiring) naming the
// live attachment, and from then on every PV's claim of it counts as
// retired. The next decision replaces it (a cut that drops the staged
// node's connection, and a new host NQN the node is not staged with), the
// export closes under it, and the leader's RetireMarked would complete
// "the release" on the other PV.
//
// Interleaving (ReadWriteOnce, one replica):
//  1. node-a publishes (PV p1): claim n1, export open to H(n1).
//  2. p0 is created for the handle (it sorts before p1: the commit
//     writes it first); it has no claims.
//  3. The same VolumeAttachment is published again: the live claim n1 is
//     looked up (on p1 only) and written to p0 (a claim p0 did not have),
//     then to p1, whose write conflicts (another writer changed p1 since
//     the decision: a label, the PV controller's status update, another
//     replica).
//  4. The take-back withdraws n1 from p0, with a record of n1.
func TestFailedRepeatedCommitKeepsTheLiveAttachment(t *testing.T) {
	a, _, client := newReviewReplicas(t, testNode("node-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const name = "pvc-35a00000-0000-4000-8000-000000000001"
	id := a.newVolume(client, name, corev1.ReadWriteOnce, false)
	resp, err := a.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	h1 := resp.PublishContext[PublishContextHostNQN]
	n1 := claimsOf(t, client, name)[nodeA].Nonce
	wantExport(t, a, id, true, h1)
	drops := a.drops(id)

	ctx := context.Background()
	const p0 = "pv-0-" + name // sorts before name
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, testPV(p0, id, corev1.ReadWriteOnce, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replica to know both PVs", func() bool { return indexedPVs(a.index.Volume(id)) == 2 })
	if first := a.index.Volume(id).PVs[0].Name; first != p0 {
		t.Fatalf("scripting: the commit should write %s first, the index lists %s first", p0, first)
	}

	held := holdAPI(a.own, "patch", "persistentvolumes", name)
	answered := make(chan error, 1)
	go func() {
		_, err := a.cs.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeA, VolumeCapability: rwo})
		answered <- err
	}()
	<-held.entered
	if !has(claimsOf(t, client, p0), nodeA) {
		t.Fatalf("scripting: the repeated publish should have written node-a's claim to %s first", p0)
	}
	// Another writer changes p1 while the commit's write to it is on its way.
	if _, err := client.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	close(held.release)
	err = <-answered
	t.Logf("the repeated publish answered: %v", err)

	for _, pv := range []string{p0, name} {
		for _, r := range retiringOf(t, client, pv) {
			if r.Is(nodeA, claims.Claim{Nonce: n1}) {
				t.Errorf("PV %s records node-a's live attachment (nonce %s, host %s) as released: the failed commit's take-back retired the answered attachment", pv, n1, h1)
			}
		}
	}
	if c, ok := claimsOf(t, client, name)[nodeA]; !ok || c.Nonce != n1 {
		t.Errorf("node-a's live attachment n1 lost its claim on %s (now %+v, held %t)", name, c, ok)
	}
	if d := a.disk(id); !d.Exported || d.AllowHost != h1 {
		t.Errorf("the export no longer lets node-a's staged attachment in: exported=%t allow-host=%s, want %s", d.Exported, d.AllowHost, h1)
	}
	if n := a.drops(id) - drops; n != 0 {
		t.Errorf("node-a's live connection was dropped %d time(s)", n)
	}
}
