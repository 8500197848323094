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

// A claim written before claims recorded node UIDs (a bare time;
// HolderStale, diagnose and the informers treat an empty UID as "same
// node"), on an export open to any host (attached before storage
// fencing): a repeated publish of that attachment gives it an attachment
// NQN of its own, answered in publish_context, and narrows the export to
// it with exactly one drop. Since node IDs no longer carry the node's own
// NQN, such an attachment cannot be narrowed to the NQN it is connected
// with; and whoever connected while the export was open to any host must
// be cut off.
func TestUpgradeRepublishOfAPreUIDClaimNarrowsTheExportWithOneDrop(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, nodeWithUID("node-a", "uid-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2e000000-0000-4000-8000-000000000005", corev1.ReadWriteOnce, false)
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Annotations = map[string]string{claims.ClaimsAnnotation: `{"node-a":"2026-11-01T00:00:00Z"}`}
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := a.disk(id)
	d.Exported = true // attached before storage fencing: open to any host
	a.rds.putDisk(d)
	a.waitClaims(id, "node-a")
	resp, err := a.publish(id, nodeA, rwo) // the same attachment, published again
	if err != nil {
		t.Fatal(err)
	}
	// Since node IDs no longer carry the node's own NQN, such an
	// attachment (made before storage fencing, its export open to any
	// host) cannot be narrowed to the NQN it is connected with: it gets
	// its own attachment NQN, and the export never stays open to any
	// host. An export that was open to any host may have let anyone in,
	// so it is dropped once as it is narrowed (the node reconnects as
	// its attachment on its next stage).
	host := resp.PublishContext[PublishContextHostNQN]
	if c := claimsOf(t, client, id)["node-a"]; c.Nonce == "" || host == "" {
		t.Errorf("claim %+v, publish_context host %q: want an attachment NQN of its own", c, host)
	}
	if d := a.disk(id); !d.Exported || d.AllowHost != host {
		t.Errorf("the export allows %q (exported=%t), want %s", d.AllowHost, d.Exported, host)
	}
	if n := a.drops(id); n != 1 {
		t.Errorf("%d drops, want 1: whoever connected while it was open to any host is cut off", n)
	}
}

// An attachment without a nonce keeps the node's own NQN, recorded in the
// claim, until it ends: a repeated publish keeps it. A repeated publish
// whose node ID carries another host NQN (the node plugin re-registered)
// neither overwrites the recorded NQN nor moves the export to the new
// one.
func TestUpgradeRepublishOfALegacyClaimKeepsItsRecordedNQN(t *testing.T) {
	a, _, client := newTwoReplicasFencedByHand(t, nodeWithUID("node-a", "uid-a"))
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := a.newVolume(client, "pvc-2e000000-0000-4000-8000-000000000006", corev1.ReadWriteOnce, false)
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Annotations = map[string]string{claims.ClaimsAnnotation: `{"node-a":{"at":"2026-11-01T00:00:00Z","uid":"uid-a","cap":"mount/SINGLE_NODE_WRITER","gen":1,"nqn":"` + nqnA + `"}}`}
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := a.disk(id)
	d.Exported, d.AllowHost = true, nqnA
	a.rds.putDisk(d)
	a.waitClaims(id, "node-a")
	// The node plugin re-registered with another host NQN (e.g. a new
	// /etc/nvme/hostnqn); the kernel connection of the live attachment is
	// still nqnA's.
	if _, err := a.publish(id, "node-a/"+nqnB, rwo); err != nil {
		t.Fatal(err)
	}
	if c := claimsOf(t, client, id)["node-a"]; c.HostNQN != nqnA {
		t.Errorf("the claim's recorded NQN changed to %q", c.HostNQN)
	}
	wantExport(t, a, id, true, nqnA)
}

// Narrowing an export that was open to any host drops it once, since
// anyone may have connected while it was
// (TestUpgradeRepublishOfAPreUIDClaimNarrowsTheExportWithOneDrop pins
// that for a repeated publish). So does a live migration off an
// attachment from before storage fencing (a claim with neither nonce nor
// recorded NQN, its export open to any host): claimHost of that claim is
// "", so the open-to-any state would count as "at a holder", and a move
// through a park (a park keeps every connection) would leave every host
// that connected while it was open to any host, a former holder released
// without a cut while storage fencing was off included, connected beside
// the target. (The drop also cuts the source, which connects with its own
// NQN and is not let back in: such a migration may have to wait, refused,
// until the source's attachment is narrowed, rather than go through.)
func TestUpgradeMigrationOffAnExportOpenToAnyHostDropsIt(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"))
	e := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwx := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	id := e.newVolume(client, "pvc-2f000000-0000-4000-8000-000000000013", corev1.ReadWriteMany, true)
	node, err := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv.Annotations = map[string]string{claims.ClaimsAnnotation: `{"node-a":{"at":"2026-11-01T00:00:00Z","uid":"` + string(node.UID) + `","cap":"block/MULTI_NODE_MULTI_WRITER","gen":1}}`}
	if _, err := client.CoreV1().PersistentVolumes().Update(context.Background(), pv, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := e.disk(id)
	d.Exported, d.AllowHost = true, "" // attached before storage fencing: open to any host
	e.rds.putDisk(d)
	e.ensureVA(id, nodeA)
	e.waitClaims(id, "node-a")
	if c := claimsOf(t, client, id)["node-a"]; c.Nonce != "" || c.HostNQN != "" {
		t.Fatalf("claim %+v; want one from before storage fencing", c)
	}
	drops := e.drops(id)
	resp, err := e.publish(id, nodeB, rwx) // a migration's target joins
	if err != nil {
		t.Fatal(err)
	}
	wantExport(t, e, id, true, resp.PublishContext[PublishContextHostNQN])
	if e.drops(id) == drops {
		t.Errorf("the export open to any host was narrowed to node-b's attachment without a drop: whoever connected while it was open to any host is still connected")
	}
}
