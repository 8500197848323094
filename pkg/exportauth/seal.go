// Package exportauth carries an attachment's DH-HMAC-CHAP secret from the
// controller to the one node plugin that may use it.
//
// The secret travels in ControllerPublishVolume's publish_context, which
// Kubernetes stores in the VolumeAttachment's status, readable by anyone
// allowed to read VolumeAttachments and exported by kube-state-metrics as
// metric labels. So it travels sealed: every node plugin holds an X25519
// key pair of its own (kept on the node, never leaving it) and registers
// the public half in its CSI node ID; the controller seals the secret to
// that key (NaCl anonymous box: X25519, XSalsa20-Poly1305); only that
// node's plugin can open it. A reader of the VolumeAttachment learns
// nothing, and a node learns only the secrets of its own attachments.
package exportauth

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/crypto/curve25519"
	"golang.org/x/crypto/nacl/box"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

// PublicKeyPrefix marks a node key in a node ID; an NQN always starts with
// "nqn.", so the two never look alike.
const PublicKeyPrefix = "x25519:"

var b64 = base64.RawURLEncoding

// ErrSealed wraps every reason a sealed secret cannot be opened.
var ErrSealed = errors.New("sealed DH-HMAC-CHAP secret")

// ErrWrongKey: the secret was sealed to another key than the node's (it
// also wraps ErrSealed). Unlike a malformed value, a new publish fixes it.
var ErrWrongKey = fmt.Errorf("%w: not sealed to this node's key", ErrSealed)

// PublicKey is a node plugin's public key.
type PublicKey [32]byte

// String is the key's form in a node ID: PublicKeyPrefix and 43 base64url
// characters.
func (k PublicKey) String() string { return PublicKeyPrefix + b64.EncodeToString(k[:]) }

// ParsePublicKey reads a key in the form String writes.
func ParsePublicKey(s string) (PublicKey, error) {
	var k PublicKey
	rest, ok := strings.CutPrefix(s, PublicKeyPrefix)
	if !ok {
		return k, fmt.Errorf("node key %q does not start with %q", s, PublicKeyPrefix)
	}
	raw, err := b64.DecodeString(rest)
	if err != nil || len(raw) != len(k) {
		return k, fmt.Errorf("node key %q is not %d bytes of unpadded base64url", s, len(k))
	}
	copy(k[:], raw)
	if err := k.check(); err != nil {
		return PublicKey{}, fmt.Errorf("node key %q: %w", s, err)
	}
	return k, nil
}

// check refuses a low-order point: X25519 with one is the same known
// value whatever the other side's key, so a secret sealed to it would open
// for anyone. No node plugin makes one (keyFrom multiplies the base
// point).
func (k PublicKey) check() error {
	var probe [32]byte
	probe[0] = 9 // any scalar: clamped, it is a multiple of the cofactor
	if _, err := curve25519.X25519(probe[:], k[:]); err != nil {
		return errors.New("it is a low-order point of Curve25519, which no node plugin makes: anything sealed to it opens for anyone; the node ID was not written by this driver's node plugin")
	}
	return nil
}

// NodeKey is a node plugin's key pair.
type NodeKey struct {
	Public  PublicKey
	private [32]byte
}

// LoadOrCreateNodeKey reads the private key at path, or makes one there
// (mode 0600, in a directory of mode 0700) when the file does not exist.
// The file outlives the node plugin's container, so the node keeps its key
// (and its node ID) across restarts and upgrades; a node that loses it gets
// a new one, and the controller seals its next attachments to that.
//
// A key file that is a symlink is refused: in the node plugin's container
// it would resolve in the container's filesystem, not the host's.
func LoadOrCreateNodeKey(path string) (*NodeKey, error) {
	k, err := readNodeKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if k, err = NewNodeKey(rand.Reader); err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the node key's directory: %w", err)
	}
	// Written to a temporary file of its own (0600, never one left over or
	// a symlink), then linked into place only where no key is yet: of two
	// plugins starting at once, both keep the key the file holds.
	tmp, err := os.CreateTemp(dir, ".node-key-*")
	if err != nil {
		return nil, fmt.Errorf("writing the node key: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(b64.EncodeToString(k.private[:]) + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp.Name(), path)
	}
	switch {
	case errors.Is(err, fs.ErrExist):
		return readNodeKey(path)
	case err != nil:
		return nil, fmt.Errorf("writing the node key: %w", err)
	}
	return k, nil
}

// readNodeKey reads the key at path; an error wrapping fs.ErrNotExist
// when there is none.
func readNodeKey(path string) (*NodeKey, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, err
	case errors.Is(err, syscall.ELOOP):
		return nil, fmt.Errorf("node key file %s is a symlink; it must be a regular file on the host (remove the link to make a new key)", path)
	case err != nil:
		return nil, fmt.Errorf("reading the node key: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("reading the node key: %w", err)
	}
	raw, derr := b64.DecodeString(strings.TrimSpace(string(b)))
	if derr != nil || len(raw) != 32 {
		return nil, fmt.Errorf("node key file %s does not hold a 32-byte base64url key; remove it to make a new one (the node's next attachments are sealed to the new key)", path)
	}
	return keyFrom([32]byte(raw))
}

// NewNodeKey makes a key pair from r.
func NewNodeKey(r io.Reader) (*NodeKey, error) {
	var priv [32]byte
	if _, err := io.ReadFull(r, priv[:]); err != nil {
		return nil, fmt.Errorf("reading random bytes for the node key: %w", err)
	}
	return keyFrom(priv)
}

func keyFrom(priv [32]byte) (*NodeKey, error) {
	pub, err := curve25519.X25519(priv[:], curve25519.Basepoint)
	if err != nil {
		return nil, fmt.Errorf("deriving the node's public key: %w", err)
	}
	k := &NodeKey{private: priv}
	copy(k.Public[:], pub)
	return k, nil
}

// Seal seals secret to the node key to, for publish_context.
func Seal(secret nvme.DHCHAPSecret, to PublicKey, r io.Reader) (string, error) {
	if secret.IsZero() {
		return "", errors.New("sealing an empty DH-HMAC-CHAP secret")
	}
	if err := to.check(); err != nil {
		return "", fmt.Errorf("sealing to node key %s: %w", to, err)
	}
	pub := [32]byte(to)
	out, err := box.SealAnonymous(nil, []byte(secret.Reveal()), &pub, r)
	if err != nil {
		return "", fmt.Errorf("sealing the DH-HMAC-CHAP secret: %w", err)
	}
	return b64.EncodeToString(out), nil
}

// Open opens a secret sealed to k and validates it.
func (k *NodeKey) Open(sealed string) (nvme.DHCHAPSecret, error) {
	raw, err := b64.DecodeString(sealed)
	if err != nil {
		return nvme.DHCHAPSecret{}, fmt.Errorf("%w: not unpadded base64url", ErrSealed)
	}
	pub, priv := [32]byte(k.Public), k.private
	plain, ok := box.OpenAnonymous(nil, raw, &pub, &priv)
	if !ok {
		return nvme.DHCHAPSecret{}, fmt.Errorf("%w %s (the node plugin's key changed since the publish, or the attachment belongs to another node); a new publish seals it to the current key, and Kubernetes publishes an attached volume only again after a detach: move the volume's pods off this node", ErrWrongKey, k.Public)
	}
	s, err := nvme.ParseDHCHAPSecret(string(plain))
	if err != nil {
		return nvme.DHCHAPSecret{}, fmt.Errorf("%w: %w", ErrSealed, err)
	}
	return s, nil
}
