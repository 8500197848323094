package csi

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// TestRestartGivesIdenticalDecisions: a controller started on an API
// that already holds attachments, claims and failed nodes reaches, once
// synced, exactly the decisions the replica that built that state reaches.
// There is no rebuild step to get wrong: the new index is the informers'.
func TestRestartGivesIdenticalDecisions(t *testing.T) {
	client := newFakeAPI(testNode("n0"), testNode("n1"), testNode("n2"), testNode("n3"))
	sharedRDS := newFakeRDS(1 << 40)
	first := newFixedPublishEnv(t, client, sharedRDS, fencing.DefaultConfig())
	ctx := context.Background()
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)

	var ids []string
	for i := 0; i < 6; i++ {
		name := fmt.Sprintf("pvc-0a1b2c3d-0000-4000-8000-%012d", 200+i)
		mode, block := corev1.ReadWriteOnce, false
		if i >= 4 {
			mode, block = corev1.ReadWriteMany, true
		}
		ids = append(ids, first.newVolume(client, name, mode, block))
	}
	mustPublish := func(id, node string, c *csi.VolumeCapability) {
		t.Helper()
		if _, err := first.publish(id, node, c); err != nil {
			t.Fatalf("publish %s to %s: %v", id, node, err)
		}
	}
	mustPublish(ids[0], "n0", rwo)
	mustPublish(ids[1], "n1", rwo)
	mustPublish(ids[2], "n2", rwo)
	mustPublish(ids[4], "n0", rwx)
	first.waitClaims(ids[4], "n0")
	mustPublish(ids[4], "n1", rwx)
	// A VolumeAttachment without a claim (attached before claims existed),
	// one being detached, and a node that failed.
	for _, va := range []struct {
		pv, node string
		deleting bool
	}{{"pvc-0a1b2c3d-0000-4000-8000-000000000203", "n3", false}, {"pvc-0a1b2c3d-0000-4000-8000-000000000202", "n2", true}} {
		obj := testVA(va.pv, va.node, publishNow.Add(-time.Hour))
		if va.deleting {
			del := metav1.NewTime(publishNow.Add(-10 * time.Second))
			obj.DeletionTimestamp = &del
			obj.Finalizers = []string{"external-attacher/rds-csi-srvlab-io"}
		}
		if _, err := putVA(ctx, client, obj); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first replica to see every change", func() bool {
		return !first.index.Node("n1").Exists && len(first.index.Volume(ids[3]).Attachments) == 1 &&
			len(first.index.Volume(ids[2]).Attachments) == 1 && !first.index.Volume(ids[1]).HasClaim("n1") &&
			!first.index.Volume(ids[4]).HasClaim("n1") // the Fencer released every claim of the deleted node
	})

	decide := func(e *publishEnv) []string {
		var out []string
		for _, id := range ids {
			v := e.index.Volume(id)
			mode := fencing.SingleNode
			if v.Block {
				mode = fencing.MultiNodeMultiWriter
			}
			for _, n := range []string{"n0", "n1", "n2", "n3"} {
				d := fencing.Decide(fencing.Request{VolumeID: id, Node: n, Mode: mode}, v.Holders(), e.index.Node, publishNow, fencing.DefaultConfig())
				out = append(out, fmt.Sprintf("%s@%s: %s %s fence=%v", id, n, d.Verdict, d.Blocking, d.Fence))
			}
		}
		return out
	}
	before := decide(first)
	first.close()
	second := newFixedPublishEnv(t, client, sharedRDS, fencing.DefaultConfig())
	after := decide(second) // no waiting: synced means indexed
	refusals := 0
	for i := range before {
		if before[i] != after[i] {
			t.Errorf("decision changed across the restart:\n before %s\n after  %s", before[i], after[i])
		}
		if strings.Contains(before[i], " refuse ") {
			refusals++
		}
	}
	if refusals == 0 {
		t.Fatal("degenerate state: nothing was refused")
	}
}
