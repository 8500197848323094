package csi

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/storagefence"
)

// The node fencer changes no export without a live read of the node it
// fences. A volume whose PersistentVolume is gone while its
// VolumeAttachment stands (its finalizers removed by hand; the index
// keeps the attachment under the handle) has no claim to read, so the
// fence's May, the live read, is never asked; yet Release now always
// settles, and a settle with no PV reads no claims and closes the export.
// The node fencer is told about a stale node by the index alone (its
// Node watch may be behind: the node deleted and re-created, a taint
// since removed), so the export of a healthy, writing node is closed on
// the cache's word. The reconcile leaves such a disk alone (no PV in the
// index: not its to judge); before the restructure, a fence with no
// claim to release did not touch the RDS either.
func TestNodeFencerClosesNoExportWithoutALiveRead(t *testing.T) {
	a, _, client := newReviewReplicas(t, testNode(nodeA))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	const name = "pvc-35900000-0000-4000-8000-000000000001"
	id := a.newVolume(client, name, corev1.ReadWriteOnce, false)
	resp, err := a.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	hA := resp.PublishContext[PublishContextHostNQN]
	ctx := context.Background()
	if err := client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the index to keep the attachment without its PV", func() bool {
		v := a.index.Volume(id)
		_, on := v.AttachmentOn(nodeA)
		return v != nil && !v.Indexed() && on
	})
	v := a.index.Volume(id)

	// The index (behind) reports node-a out of service; the API server
	// has it healthy.
	nf := storagefence.NewNodeFencer(storagefence.NodeFencerConfig{Fence: a.fence, Nodes: a.live, Policy: fencing.DefaultConfig(),
		Reporter: fencing.NewReporter(nil, &fenceReasons{})})
	err = nf.NodeStale(ctx, fencing.StaleHolder{Node: nodeA, Reason: fencing.FenceOutOfService, Volumes: []fencing.VolumeRef{v.Ref()}})
	t.Logf("the fence: %v", err)
	if d := a.disk(id); !d.Exported || d.AllowHost != hA {
		t.Errorf("a fence of node-a, healthy by the API server, closed its export (exported=%t allow-host=%s, want %s) with no live read of the node", d.Exported, d.AllowHost, hA)
	}
}
