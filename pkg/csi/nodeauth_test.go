package csi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/crypto/nacl/box"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/srvlab/rds-csi/pkg/exportauth"
	"github.com/srvlab/rds-csi/pkg/nvme"
)

func nodeKeyFrom(t *testing.T, b byte) *exportauth.NodeKey {
	t.Helper()
	k, err := exportauth.NewNodeKey(bytes.NewReader(bytes.Repeat([]byte{b}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// NodeStageVolume of an authenticated attachment opens the secret sealed
// to this node's key and connects with it; every way the publish_context
// or the node can be wrong is refused before the connect, with the right
// code and without the secret in the message.
func TestNodeStageAuthenticated(t *testing.T) {
	const (
		vol     = "pvc-8d2f6a1e-3c4b-4e5d-9f60-7a8b9c0d1e2f"
		attachA = "nqn.2014-08.org.nvmexpress:uuid:3f2b8c1d-6e4a-4b5c-9d8e-7f6a5b4c3d2e"
	)
	secret, err := nvme.NewDHCHAPSecret(bytes.NewReader(bytes.Repeat([]byte{9}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	mine, other := nodeKeyFrom(t, 1), nodeKeyFrom(t, 2)
	seal := func(to *exportauth.NodeKey, s nvme.DHCHAPSecret) string {
		out, err := exportauth.Seal(s, to.Public, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	authed := func(sealed string) map[string]string {
		return map[string]string{PublishContextHostNQN: attachA, PublishContextAuth: AuthDHCHAP, PublishContextSecret: sealed}
	}
	for _, tc := range []struct {
		name     string
		key      *exportauth.NodeKey
		why      string
		publish  map[string]string
		wantCode codes.Code // OK: connects
		wantMsg  string
	}{
		{name: "sealed to this node", key: mine, publish: authed(seal(mine, secret))},
		{name: "no authentication", key: mine, publish: map[string]string{PublishContextHostNQN: attachA}},
		{name: "sealed to another node", key: mine, publish: authed(seal(other, secret)), wantCode: codes.FailedPrecondition, wantMsg: "not sealed to this node's key"},
		{name: "scheme without a secret", key: mine, publish: map[string]string{PublishContextAuth: AuthDHCHAP}, wantCode: codes.InvalidArgument, wantMsg: "carries no dhchapSecret"},
		{name: "empty secret", key: mine, publish: authed(""), wantCode: codes.InvalidArgument, wantMsg: "carries no dhchapSecret"},
		{name: "secret without a scheme", key: mine, publish: map[string]string{PublishContextSecret: seal(mine, secret)}, wantCode: codes.InvalidArgument, wantMsg: "but no auth"},
		{name: "unknown scheme", key: mine, publish: map[string]string{PublishContextAuth: "tls-psk", PublishContextSecret: seal(mine, secret)}, wantCode: codes.InvalidArgument, wantMsg: "upgrade the node plugin"},
		{name: "not base64", key: mine, publish: authed("%%%"), wantCode: codes.InvalidArgument, wantMsg: "base64url"},
		{name: "sealed, but not a secret", key: mine, publish: authed(sealRaw(t, mine, "DHHC-1:00:short:")), wantCode: codes.InvalidArgument, wantMsg: "malformed DH-HMAC-CHAP secret"},
		{name: "a kernel without authentication", why: "the kernel does not accept dhchap_secret", publish: authed(seal(mine, secret)),
			wantCode: codes.FailedPrecondition, wantMsg: "this node cannot do it: the kernel does not accept dhchap_secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := &recordingConnector{dev: "/dev/nvme0n1"}
			ns := nodeInfoServer(t, rc)
			ns.SetNodeKey(tc.key, tc.why)
			_, err := ns.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
				VolumeId: vol, StagingTargetPath: t.TempDir(), VolumeCapability: blockCapability(sw),
				VolumeContext: map[string]string{VolumeContextNVMeAddress: "10.0.0.5"}, PublishContext: tc.publish,
			})
			got := rc.connected()
			if tc.wantCode != codes.OK {
				if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantMsg) || !strings.Contains(err.Error(), vol) {
					t.Fatalf("NodeStageVolume = %v, want %v naming %s and saying %q", err, tc.wantCode, vol, tc.wantMsg)
				}
				if strings.Contains(err.Error(), secret.Reveal()[10:30]) {
					t.Fatalf("the error shows the secret: %v", err)
				}
				if len(got) != 0 {
					t.Fatalf("connected %d times despite the error", len(got))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("connected %d times", len(got))
			}
			_, wantSecret := tc.publish[PublishContextSecret]
			if wantSecret != !got[0].Secret.IsZero() || (wantSecret && !got[0].Secret.Equal(secret)) {
				t.Fatalf("connected with secret set=%v, want %v (and equal to the sealed one)", !got[0].Secret.IsZero(), wantSecret)
			}
		})
	}
}

// The node key is registered in the node ID only when the node can
// authenticate; a node that cannot registers its name alone.
func TestNodeIDRegistersTheKey(t *testing.T) {
	rc := &recordingConnector{dev: "/dev/nvme0n1"}
	ns := nodeInfoServer(t, rc)
	k := nodeKeyFrom(t, 4)
	ns.SetNodeKey(k, "")
	id, err := ns.NodeID()
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseNodeID(id)
	if err != nil || parsed.Key == nil || *parsed.Key != k.Public {
		t.Fatalf("node ID %q = %+v, %v; want the node key in it", id, parsed, err)
	}
	ns.SetNodeKey(nil, "no auth here")
	if id, err := ns.NodeID(); err != nil || strings.Contains(id, "/") {
		t.Fatalf("a node without authentication registered %q, %v", id, err)
	}
	if ns.AuthUnavailable() != "no auth here" {
		t.Fatalf("AuthUnavailable = %q", ns.AuthUnavailable())
	}
}

// sealRaw seals any bytes, as a broken or hostile controller could.
func sealRaw(t *testing.T, to *exportauth.NodeKey, plain string) string {
	t.Helper()
	pub := [32]byte(to.Public)
	out, err := box.SealAnonymous(nil, []byte(plain), &pub, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(out)
}

// A node whose key was replaced (its key file lost or removed, the node
// reinstalled under its name) still has attachments whose secret was
// sealed to the old key: their VolumeAttachments are attached, so nothing
// publishes them again, and every NodeStage (a pod moved here, a reboot)
// is refused for good.
func TestNodeStageAfterTheNodeKeyWasReplaced(t *testing.T) {
	t.Skip("hole: a secret sealed to the node's previous key is refused with FAILED_PRECONDITION saying 'a new publish seals it to the current key', but Kubernetes does not publish an attached VolumeAttachment again, so the volume cannot be staged on this node until its VolumeAttachment is deleted by hand. Needs a design. The node keeping its previous key(s) does not reach it: the plugin replaces its key only when the key file is gone (LoadOrCreateNodeKey), so the old key is gone with it. What would: the controller re-sealing the secret to the node's new key (seen in its CSINode) into the VolumeAttachment's status, which the attacher owns (needs update on volumeattachments/status and care not to race the attacher)")
	const vol = "pvc-8d2f6a1e-3c4b-4e5d-9f60-7a8b9c0d1e2f"
	secret, err := nvme.NewDHCHAPSecret(bytes.NewReader(bytes.Repeat([]byte{9}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	old, replaced := nodeKeyFrom(t, 1), nodeKeyFrom(t, 2)
	sealed, err := exportauth.Seal(secret, old.Public, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rc := &recordingConnector{dev: "/dev/nvme0n1"}
	ns := nodeInfoServer(t, rc)
	ns.SetNodeKey(replaced, "")
	_, err = ns.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{
		VolumeId: vol, StagingTargetPath: t.TempDir(), VolumeCapability: blockCapability(sw),
		VolumeContext:  map[string]string{VolumeContextNVMeAddress: "10.0.0.5"},
		PublishContext: map[string]string{PublishContextHostNQN: "nqn.2014-08.org.nvmexpress:uuid:3f2b8c1d-6e4a-4b5c-9d8e-7f6a5b4c3d2e", PublishContextAuth: AuthDHCHAP, PublishContextSecret: sealed},
	})
	if err != nil {
		t.Fatalf("an attachment sealed to the node's previous key cannot be staged: %v", err)
	}
}
