package csi

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/fencing"
)

// An attachment made before per-attachment host NQNs (its claim records
// the node's own NQN, no nonce; the export allows that NQN) keeps working
// across the upgrade until it ends: a repeated publish, from the old node
// plugin (node ID "name/its NQN") or an upgraded one (the bare name),
// answers without a hostNQN (the node keeps connecting with its own),
// changes nothing on the RDS and keeps the claim's NQN; the reconcile
// leaves it alone. A new attachment asked for by an old node plugin
// (which would connect with its own NQN) is refused; from an upgraded one
// it gets its own NQN.
func TestUpgradeAttachmentFromBeforePerAttachmentNQNs(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-21000000-0000-4000-8000-00000000000a", corev1.ReadWriteOnce, false)

	// The state the previous version left: claim with the node's NQN, the
	// export open to it, the VolumeAttachment attached (its
	// attachmentMetadata without hostNQN).
	setOldClaim(t, client, id, claims.Claim{At: testClock, Capability: claimCapability(rwo), Gen: 3, HostNQN: nqnA})
	d := e.disk(id)
	d.Exported, d.AllowHost = true, nqnA
	e.rds.putDisk(d)
	e.ensureVA(id, nodeA)
	e.markAttached(id, nodeA, map[string]string{PublishContextNQN: testNQNPrefix + id})
	e.waitClaims(id, "node-a")

	for _, nodeID := range []string{oldPluginA, nodeA} {
		resp, err := e.publish(id, nodeID, rwo)
		if err != nil {
			t.Fatalf("repeated publish of an attachment from before the upgrade, node ID %q: %v", nodeID, err)
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
	}
	if n, err := e.fence.Reconcile(context.Background(), nil); err != nil || n != 0 {
		t.Fatalf("reconcile of an attachment from before = %d, %v; want nothing to fix", n, err)
	}
	wantExport(t, e, id, true, nqnA)

	// It ends; the next attachment gets its own NQN.
	if err := e.unpublish(id, nodeA); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, e, id)
	e.waitClaims(id)
	// An old node plugin would connect with its own NQN: refused, and
	// nothing recorded or opened.
	if _, err := e.publish(id, oldPluginA, rwo); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "upgrade the node plugin") {
		t.Fatalf("a new attachment for an old node plugin: %v, want FAILED_PRECONDITION naming the upgrade", err)
	}
	wantClosed(t, e, id)
	if c, ok := claimsOf(t, client, id)["node-a"]; ok {
		t.Fatalf("the refused publish left a claim %+v", c)
	}
	resp, err := e.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	host := resp.PublishContext[PublishContextHostNQN]
	if host == "" || host == nqnA {
		t.Fatalf("the next attachment's host NQN is %q; want its own", host)
	}
	wantExport(t, e, id, true, host)
}

// A volume attached before storage fencing was turned on has a claim that
// records no host at all. Its export must never open to any host for want
// of one: from a node plugin that registers its NQN, that NQN is recorded
// (the node is connected with it); from one that registers the bare name,
// the attachment gets its own NQN, in publish_context.
func TestUpgradeAttachmentFromBeforeStorageFencing(t *testing.T) {
	for _, tc := range []struct {
		nodeID, wantHost string
	}{
		{oldPluginA, nqnA},
		{nodeA, ""}, // its own: checked below
	} {
		t.Run(tc.nodeID, func(t *testing.T) {
			client := newFakeAPI(testNode("node-a"))
			e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
			rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
			id := e.newVolume(client, "pvc-21000000-0000-4000-8000-00000000000b", corev1.ReadWriteOnce, false)
			setOldClaim(t, client, id, claims.Claim{At: testClock, Capability: claimCapability(rwo), Gen: 2})
			e.ensureVA(id, nodeA)
			e.waitClaims(id, "node-a")
			resp, err := e.publish(id, tc.nodeID, rwo)
			if err != nil {
				t.Fatal(err)
			}
			d := e.disk(id)
			if !d.Exported || d.AllowHost == "" {
				t.Fatalf("export %+v: open to any host", d)
			}
			c := claimsOf(t, client, id)["node-a"]
			if tc.wantHost != "" {
				if d.AllowHost != tc.wantHost || c.HostNQN != tc.wantHost || c.Nonce != "" {
					t.Fatalf("export allows %q, claim %+v; want the node's own %s recorded", d.AllowHost, c, tc.wantHost)
				}
				return
			}
			host := resp.PublishContext[PublishContextHostNQN]
			if c.Nonce == "" || host == "" || d.AllowHost != host {
				t.Fatalf("claim %+v, publish_context host %q, export allows %q: want an attachment NQN of its own, answered and allowed", c, host, d.AllowHost)
			}
		})
	}
}

// setOldClaim writes node-a's claim c (with node-a's UID) on PV id as an
// earlier release of the driver left it.
func setOldClaim(t *testing.T, client *fake.Clientset, id string, c claims.Claim) {
	t.Helper()
	node, err := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.NodeUID = string(node.UID)
	raw, err := json.Marshal(map[string]claims.Claim{"node-a": c})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Annotations = map[string]string{claims.ClaimsAnnotation: string(raw)}
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
