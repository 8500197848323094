package exportauth

import (
	"crypto/rand"
	"strings"
	"testing"

	"golang.org/x/crypto/blake2b"
	"golang.org/x/crypto/nacl/box"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

// A node key that is a low-order point of Curve25519 (all zeros, or one
// of the few others) makes every X25519 with it the same known value:
// a secret sealed to it opens for anyone who reads the VolumeAttachment.
// No key a node plugin makes is one (keyFrom multiplies the base point),
// so a node ID carrying one was written by hand or by a broken plugin: it
// is refused, with an error that says why.
func TestLowOrderNodeKeyIsRefused(t *testing.T) {
	var zero PublicKey
	// What accepting it would give away: an outsider opens the secret.
	secret, err := nvme.NewDHCHAPSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := Seal(secret, zero, rand.Reader)
	if err == nil {
		raw, derr := b64.DecodeString(sealed)
		if derr != nil {
			t.Fatal(derr)
		}
		var eph, anyPriv [32]byte
		copy(eph[:], raw[:32])
		h, _ := blake2b.New(24, nil)
		h.Write(eph[:])
		h.Write(zero[:])
		var nonce [24]byte
		copy(nonce[:], h.Sum(nil))
		zp := [32]byte(zero)
		if plain, ok := box.Open(nil, raw[32:], &nonce, &zp, &anyPriv); ok && string(plain) == secret.Reveal() {
			t.Log("a secret sealed to the all-zero key opens without the node's private key")
		}
	}
	if _, err := ParsePublicKey(zero.String()); err == nil || !strings.Contains(err.Error(), "low-order") {
		t.Fatalf("ParsePublicKey of the all-zero key = %v, want refused as a low-order point", err)
	}
	if _, err := Seal(secret, zero, rand.Reader); err == nil {
		t.Fatal("Seal to the all-zero key succeeded: anyone can open what it seals")
	}
	k, err := NewNodeKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParsePublicKey(k.Public.String()); err != nil {
		t.Fatalf("a node's own key is refused: %v", err)
	}
}
