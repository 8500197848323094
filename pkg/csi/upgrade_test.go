package csi

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/informers"
)

// An attachment made before per-attachment host NQNs (its claim records
// the node's own NQN, no nonce; the export allows that NQN) keeps working
// across the upgrade until it ends: a repeated publish answers without a
// hostNQN (the node keeps connecting with its own), changes nothing on the
// RDS and keeps the claim's NQN; the reconcile leaves it alone. The next
// new attachment of the volume gets its own NQN.
func TestUpgradeAttachmentFromBeforePerAttachmentNQNs(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-21000000-0000-4000-8000-00000000000a", corev1.ReadWriteOnce, false)

	// The state the previous version left: claim with the node's NQN, the
	// export open to it, the VolumeAttachment attached (its
	// attachmentMetadata without hostNQN).
	node, err := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := informers.Claim{At: testClock, NodeUID: string(node.UID), Capability: claimCapability(rwo), Gen: 3, HostNQN: nqnA}
	raw, err := json.Marshal(map[string]informers.Claim{"node-a": old})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Annotations = map[string]string{informers.ClaimsAnnotation: string(raw)}
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := e.disk(id)
	d.Exported, d.AllowHost = true, nqnA
	e.rds.putDisk(d)
	e.ensureVA(id, nodeA)
	e.markAttached(id, nodeA, map[string]string{PublishContextNQN: testNQNPrefix + id})
	e.waitClaims(id, "node-a")

	resp, err := e.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatalf("repeated publish of an attachment from before the upgrade: %v", err)
	}
	if h, ok := resp.PublishContext[PublishContextHostNQN]; ok {
		t.Fatalf("publish_context carries hostNQN %q for an attachment from before: the node would reconnect as another host", h)
	}
	wantExport(t, e, id, true, nqnA)
	if n := e.drops(id); n != 0 {
		t.Fatalf("%d drops for a repeated publish of an attachment from before", n)
	}
	if c := claimsOf(t, client, id)["node-a"]; c.Nonce != "" || c.HostNQN != nqnA {
		t.Fatalf("the claim from before became nonce %q, host %q; want it kept on %s", c.Nonce, c.HostNQN, nqnA)
	}
	if n, err := e.cs.ReconcileExports(context.Background(), nil); err != nil || n != 0 {
		t.Fatalf("reconcile of an attachment from before = %d, %v; want nothing to fix", n, err)
	}
	wantExport(t, e, id, true, nqnA)

	// It ends; the next attachment gets its own NQN.
	if err := e.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, e, id)
	e.waitClaims(id)
	resp, err = e.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	host := resp.PublishContext[PublishContextHostNQN]
	if host == "" || host == nqnA {
		t.Fatalf("the next attachment's host NQN is %q; want its own", host)
	}
	wantExport(t, e, id, true, host)
}
