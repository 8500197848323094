package csi

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/srvlab/rds-csi/pkg/exportauth"
	"github.com/srvlab/rds-csi/pkg/fencing"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// newAuthEnv is a replica with --storage-fencing=allow-host and
// --export-auth=dhchap, its calls logged into the returned buffer.
func newAuthEnv(t *testing.T, client *fake.Clientset, rdsFake *fakeRDS) (*publishEnv, *lockedLog) {
	e := newPublishEnvWith(t, client, rdsFake, fencing.DefaultConfig(), exportAuthOptions())
	log := &lockedLog{}
	e.ctx = klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(log), textlogger.Verbosity(10))))
	return e, log
}

type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newNodeKey(t *testing.T) *exportauth.NodeKey {
	t.Helper()
	k, err := exportauth.NewNodeKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// openSecret opens publish_context's sealed secret with k.
func openSecret(t *testing.T, k *exportauth.NodeKey, pc map[string]string) nvme.DHCHAPSecret {
	t.Helper()
	if pc[PublishContextAuth] != AuthDHCHAP || pc[PublishContextSecret] == "" {
		t.Fatalf("publish_context %v: want %s=%s and a sealed %s", keysOf(pc), PublishContextAuth, AuthDHCHAP, PublishContextSecret)
	}
	s, err := k.Open(pc[PublishContextSecret])
	if err != nil {
		t.Fatalf("the node's key does not open the secret: %v", err)
	}
	return s
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// An authenticated publish hands the node the secret the RDS printed for
// its attachment, sealed to its key alone; a repeated publish answers the
// same; a move gives another; a node without a key is refused; the secret
// shows in no log line, event or error.
func TestExportAuthPublish(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"))
	e, log := newAuthEnv(t, client, nil)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-0000000000a1", corev1.ReadWriteOnce, false)
	keyA, keyB := newNodeKey(t), newNodeKey(t)
	idA, idB := "node-a/"+keyA.Public.String(), "node-b/"+keyB.Public.String()

	// No key in the node ID: refused, nothing opened.
	_, err := e.publish(id, nodeA, rwo)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "registers no node key") {
		t.Fatalf("publish to a node without a key = %v, want FailedPrecondition naming the missing key", err)
	}
	wantClosed(t, e, id)
	refused := err

	first, err := e.publish(id, idA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	hostA := e.hostOf(id, "node-a")
	wantExport(t, e, id, true, hostA)
	secretA := openSecret(t, keyA, first.PublishContext)
	if d := e.disk(id); d.Secret.IsZero() || !d.Secret.Equal(secretA) {
		t.Fatalf("the secret node-a opens is not the one the RDS prints for its export")
	}
	if _, err := keyB.Open(first.PublishContext[PublishContextSecret]); err == nil {
		t.Fatal("another node's key opens node-a's secret")
	}
	// A repeated publish: the same answer, nothing sent to the RDS.
	e.waitClaims(id, "node-a")
	swaps := e.rds.callCount("SwapExportAuth")
	again, err := e.publish(id, idA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	if again.PublishContext[PublishContextSecret] != first.PublishContext[PublishContextSecret] || e.rds.callCount("SwapExportAuth") != swaps || e.drops(id) != 0 {
		t.Fatalf("a repeated publish changed the answer or the export (swaps %d -> %d, drops %d)", swaps, e.rds.callCount("SwapExportAuth"), e.drops(id))
	}

	// A move: a new host, a new secret, node-b's alone.
	if err := e.unpublish(id, idA); err != nil {
		t.Fatal(err)
	}
	wantClosed(t, e, id)
	if d := e.disk(id); !d.Secret.IsZero() {
		t.Fatal("a closed export keeps the last attachment's password")
	}
	moved, err := e.publish(id, idB, rwo)
	if err != nil {
		t.Fatal(err)
	}
	secretB := openSecret(t, keyB, moved.PublishContext)
	if secretB.Equal(secretA) || !e.disk(id).Secret.Equal(secretB) {
		t.Fatal("the move kept node-a's secret, or node-b's is not the one the RDS prints")
	}
	if _, err := keyA.Open(moved.PublishContext[PublishContextSecret]); err == nil {
		t.Fatal("node-a's key opens node-b's secret")
	}

	var seen []string
	seen = append(seen, log.String())
	seen = append(seen, e.drainEvents()...)
	seen = append(seen, refused.Error())
	if !strings.Contains(seen[0], "published") {
		t.Fatalf("the captured log holds no publish, so it proves nothing:\n%s", seen[0])
	}
	for _, s := range []nvme.DHCHAPSecret{secretA, secretB} {
		for _, text := range seen {
			if strings.Contains(text, s.Reveal()) {
				t.Fatalf("a secret shows in a log line, an event or an error:\n%s", text)
			}
		}
	}
}

// Turning the mode on: an attachment made before (its export has no
// password) keeps its connection and its unauthenticated publish_context
// on a repeated publish, until it moves; the next attachment authenticates.
func TestExportAuthUpgradeKeepsLiveAttachments(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	before := newFencedEnv(t, client, fencing.DefaultConfig(), false)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := before.newVolume(client, "pvc-5f000000-0000-4000-8000-0000000000a2", corev1.ReadWriteOnce, false)
	first, err := before.publish(id, nodeA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	before.close()

	after, _ := newAuthEnv(t, client, before.rds)
	key := newNodeKey(t)
	idA := "node-a/" + key.Public.String()
	waitFor(t, "the new replica to see node-a's claim", func() bool {
		v := after.index.Volume(id)
		_, ok := v.Claims.Get("node-a")
		return v.Indexed() && ok
	})
	again, err := after.publish(id, idA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	if again.PublishContext[PublishContextHostNQN] != first.PublishContext[PublishContextHostNQN] {
		t.Fatal("the repeated publish changed the attachment's host NQN")
	}
	if _, ok := again.PublishContext[PublishContextAuth]; ok || after.drops(id) != 0 || !after.disk(id).Secret.IsZero() {
		t.Fatalf("the live attachment was upgraded in place (publish_context %v, drops %d): its staged connection has no secret", keysOf(again.PublishContext), after.drops(id))
	}
	if err := after.unpublish(id, idA); err != nil {
		t.Fatal(err)
	}
	next, err := after.publish(id, idA, rwo)
	if err != nil {
		t.Fatal(err)
	}
	if s := openSecret(t, key, next.PublishContext); !after.disk(id).Secret.Equal(s) {
		t.Fatal("the next attachment's secret is not the one the RDS prints")
	}
}

// Turning the mode off: an export that still has an attachment's password
// loses it at its next change, so the next holder, told of no secret, can
// connect.
func TestExportAuthTurnedOffClearsThePassword(t *testing.T) {
	client := newFakeAPI(testNode("node-a"), testNode("node-b"))
	on, _ := newAuthEnv(t, client, nil)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := on.newVolume(client, "pvc-5f000000-0000-4000-8000-0000000000a3", corev1.ReadWriteOnce, false)
	idA := "node-a/" + newNodeKey(t).Public.String()
	if _, err := on.publish(id, idA, rwo); err != nil {
		t.Fatal(err)
	}
	if on.disk(id).Secret.IsZero() {
		t.Fatal("no password set in the mode")
	}
	on.close()

	off := newPublishEnvWith(t, client, on.rds, fencing.DefaultConfig(), allowHostOptions())
	waitFor(t, "the new replica to see node-a's claim", func() bool {
		v := off.index.Volume(id)
		_, ok := v.Claims.Get("node-a")
		return v.Indexed() && ok
	})
	if err := off.unpublish(id, idA); err != nil {
		t.Fatal(err)
	}
	resp, err := off.publish(id, nodeB, rwo)
	if err != nil {
		t.Fatal(err)
	}
	wantExport(t, off, id, true, off.hostOf(id, "node-b"))
	if _, ok := resp.PublishContext[PublishContextAuth]; ok || !off.disk(id).Secret.IsZero() {
		t.Fatalf("with the mode off, node-b's export keeps a password (publish_context %v)", keysOf(resp.PublishContext))
	}
}

// A RouterOS that does not know the export password refuses the set as
// bad input ("expected end of command"); with --export-auth=dhchap every
// authenticated publish then fails the same way, which no retry changes
// and which is not the CO's request at fault: FAILED_PRECONDITION saying
// what to do, the password never in it (not INVALID_ARGUMENT with only
// the command).
func TestExportAuthRefusedPasswordSaysWhatToDo(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e, _ := newAuthEnv(t, client, nil)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-0000000000c1", corev1.ReadWriteOnce, false)
	e.rds.failNext("SwapExportAuth", fmt.Errorf("exporting disk %q: %w", id, rds.NewCommandError(`/disk set ... nvme-tcp-server-password="<hidden>"`, "expected end of command (line 1 column 97)")))
	_, err := e.publish(id, "node-a/"+newNodeKey(t).Public.String(), rwo)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--export-auth") {
		t.Fatalf("publish with the password refused = %v, want FailedPrecondition naming --export-auth", err)
	}
}

// The client's own validation before sending (an invalid host, slot or
// password) is not RouterOS refusing the property: it is not reported as
// an RDS without export passwords (which named --export-auth for any
// invalid argument before, 9d1f57e).
func TestExportAuthOwnValidationIsNotARefusedPassword(t *testing.T) {
	client := newFakeAPI(testNode("node-a"))
	e, _ := newAuthEnv(t, client, nil)
	rwo := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")
	id := e.newVolume(client, "pvc-5f000000-0000-4000-8000-0000000000c2", corev1.ReadWriteOnce, false)
	e.rds.failNext("SwapExportAuth", fmt.Errorf("%w: an export password must be 16-64 letters and digits", rds.ErrInvalidArgument))
	_, err := e.publish(id, "node-a/"+newNodeKey(t).Public.String(), rwo)
	if err == nil || strings.Contains(err.Error(), "--export-auth") {
		t.Fatalf("publish with the client's own validation failing = %v, want an error that does not blame the RDS's export password", err)
	}
}

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
