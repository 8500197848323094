package csi

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
)

// A password set and no secret readable (a RouterOS user without the
// sensitive policy) fails the publish, and the retry fails too: the
// export the first try opened has this attachment's password, so a node
// told of no secret could not connect. Only an attachment made before the
// mode was on is published without one.
func TestExportAuthRetryAfterAnUnreadSecretStillFails(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e, _ := newAuthEnv(t, client, nil)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-0000000000b1", corev1.ReadWriteOnce, false)
	idA := "node-a/" + newNodeKey(t).Public.String()
	e.rds.mu.Lock()
	e.rds.hideSecrets = true
	e.rds.mu.Unlock()

	_, err := e.publish(id, idA, rwo)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("publish with the secret unreadable = %v, want Unavailable", err)
	}
	if e.disk(id).Secret.IsZero() {
		t.Fatal("the first try set no password, so the retry below proves nothing")
	}
	e.waitClaims(id, "node-a")
	resp, err := e.publish(id, idA, rwo)
	if err == nil {
		t.Fatalf("the retry answered success (publish_context keys %v) on an export with this attachment's password and no secret to hand the node", keysOf(resp.PublishContext))
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "secret") {
		t.Fatalf("the retry = %v, want Unavailable saying the secret could not be read", err)
	}
}

// Readers only (a ReadOnlyMany PV, MULTI_NODE_READER_ONLY publishes): the
// export is open to any host with no password, and each reader, though
// its claim was made with the mode on, is answered without a secret,
// also on a repeated publish: never refused for a secret it cannot have.
func TestExportAuthReadersOnlyNeedNoSecret(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"))
	e, _ := newAuthEnv(t, client, nil)
	rox := mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-0000000000b2", corev1.ReadOnlyMany, false)
	ids := []string{"node-a/" + newNodeKey(t).Public.String(), "node-b/" + newNodeKey(t).Public.String()}
	for _, n := range ids {
		resp, err := e.publish(id, n, rox)
		if err != nil {
			t.Fatalf("reader %s: %v", n, err)
		}
		if _, ok := resp.PublishContext[PublishContextAuth]; ok {
			t.Fatalf("reader %s was handed a secret for an export open to any host", n)
		}
		wantExport(t, e, id, true, "")
	}
	e.waitClaims(id, "node-a", "node-b")
	if !e.disk(id).Secret.IsZero() {
		t.Fatal("an export open to any host has a password")
	}
	if _, err := e.publish(id, ids[0], rox); err != nil {
		t.Fatalf("a reader's repeated publish: %v", err)
	}
}
