package csi

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/srvlab/rds-csi/pkg/exportauth"
	"github.com/srvlab/rds-csi/pkg/informers"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// Per-attachment host NQNs (storage fencing). Every new claim of a volume
// by a node gets a random nonce, stored in the claim; the host NQN of that
// attachment is derived from the nonce, the volume and the node with a key
// only the controller holds, so the PV annotation (readable far more
// widely than VolumeAttachment status) does not give it away. The
// controller hands it to the node in publish_context (PublishContextHostNQN),
// the node connects with it, and the RDS export allows exactly it. A host
// fenced once can never reconnect to a later export of the volume, even
// on the same node: that attachment's NQN is never allowed again, and a
// guess is a 122-bit guess.
//
// It belongs to the attachment, not to the publish call: a repeated
// publish keeps the claim's nonce and so returns the same NQN (a new one
// would cut off the connection already staged).

// PublishContextHostNQN is the publish_context key of the attachment's
// host NQN: NodeStageVolume connects with it (and a host ID derived from
// it). Absent without storage fencing, and for attachments made before
// per-attachment host NQNs: the node then connects with its own.
const PublishContextHostNQN = "hostNQN"

// attachmentNQNPrefix is the plain form every initiator uses for a
// uuid-based host NQN.
const attachmentNQNPrefix = "nqn.2014-08.org.nvmexpress:uuid:"

// minAttachmentKey is the shortest attachment key accepted.
const minAttachmentKey = 32

// newNonce returns a fresh claim nonce: 128 random bits in hex.
func newNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("reading random bytes for an attachment nonce: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// attachmentNQN derives the host NQN of the attachment of volume handle
// on node with nonce: an HMAC-SHA256 under key, formatted as a version-4
// UUID so that it is indistinguishable from any initiator's own.
func attachmentNQN(key []byte, handle, node, nonce string) string {
	m := hmac.New(sha256.New, key)
	// NUL separators: none of the three can contain one.
	m.Write([]byte("rds-csi attachment host v1\x00" + handle + "\x00" + node + "\x00" + nonce))
	b := m.Sum(nil)[:16]
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%s%x-%x-%x-%x-%x", attachmentNQNPrefix, b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// tombstoneNQN is a fresh host name for a closed export: random, so no
// host has it, and never used twice, so a command conditioned on the
// closed state it replaces can never match again.
func tombstoneNQN() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("reading random bytes for a closed export's host name: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%s%x-%x-%x-%x-%x", attachmentNQNPrefix, b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// parkedNQN is a fresh host name for an export parked on its way from
// the host from to another: open, so the connections it has stay, but to
// a host nobody has. Its first 8 bytes are random (every parked state is
// new, so a command conditioned on one matches at most once) and its
// last 8 an HMAC of them, the volume and from under the attachment key,
// so that any replica can tell where a parked export came from
// (parkedFrom) and finish or undo the move without dropping a live
// holder's connection.
func parkedNQN(key []byte, handle, from string) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:8]); err != nil {
		return "", fmt.Errorf("reading random bytes for a parked export's host name: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	copy(b[8:], parkMAC(key, handle, from, b[:8]))
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%s%x-%x-%x-%x-%x", attachmentNQNPrefix, b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

func parkMAC(key []byte, handle, from string, nonce []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("rds-csi parked export v1\x00" + handle + "\x00" + from + "\x00"))
	m.Write(nonce)
	return m.Sum(nil)[:8]
}

// parkedFrom reports whether host is a parked state (parkedNQN) of
// handle's export made on the way from the host from.
func parkedFrom(key []byte, handle, host, from string) bool {
	u, ok := strings.CutPrefix(host, attachmentNQNPrefix)
	if !ok {
		return false
	}
	b, err := hex.DecodeString(strings.ReplaceAll(u, "-", ""))
	if err != nil || len(b) != 16 {
		return false
	}
	mac := parkMAC(key, handle, from, b[:8])
	mac[0] = mac[0]&0x3f | 0x80
	return hmac.Equal(mac, b[8:])
}

// claimHost is the host NQN the export allows for node's claim c on
// handle: the attachment's own NQN; for a claim made before per-attachment
// NQNs, the node's NQN it recorded; for one made before storage fencing,
// "" (any host, as it was).
func (d *Driver) claimHost(handle, node string, c informers.Claim) string {
	if c.Nonce != "" {
		return attachmentNQN(d.opts.AttachmentKey, handle, node, c.Nonce)
	}
	return c.HostNQN
}

// LoadAttachmentKey reads the key per-attachment host NQNs are derived
// with: --attachment-key-file when set; otherwise derived from the RDS SSH
// private key, which only the controller holds already. Changing the key
// changes the NQN of every live attachment, whose exports the controller
// would then close as unclaimed: change it only with no volume attached.
func LoadAttachmentKey(keyFile, sshKeyFile string) ([]byte, error) {
	if keyFile != "" {
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("reading the attachment key: %w", err)
		}
		if rds.IsPublicKey(b) {
			return nil, fmt.Errorf("the attachment key file %s holds a public SSH key: the attachment key must be secret (e.g. openssl rand -hex 32)", keyFile)
		}
		if len(b) < minAttachmentKey {
			return nil, fmt.Errorf("the attachment key in %s is %d bytes; at least %d random bytes are needed (e.g. openssl rand -hex 32)", keyFile, len(b), minAttachmentKey)
		}
		return b, nil
	}
	if sshKeyFile == "" {
		return nil, errors.New("no attachment key: set --attachment-key-file or --rds-key-file")
	}
	b, err := os.ReadFile(sshKeyFile)
	if err != nil {
		return nil, fmt.Errorf("reading the RDS SSH key to derive the attachment key from: %w", err)
	}
	// A public key is no secret to derive one from.
	if rds.IsPublicKey(b) {
		return nil, fmt.Errorf("--rds-key-file %s is a public key; the private key is wanted (%s, the file without .pub), and the attachment key is derived from it", sshKeyFile, strings.TrimSuffix(sshKeyFile, ".pub"))
	}
	m := hmac.New(sha256.New, b)
	m.Write([]byte("rds-csi attachment key v1"))
	return m.Sum(nil), nil
}

// Authenticated attachments (--export-auth=dhchap). An attachment's export
// password is derived, like its host NQN, with the attachment key, from
// the volume and the host NQN it goes with: a repeated publish of the same
// attachment computes the same password (no new set, the same secret, the
// connection staged with it stays good), and a fence or a move, which
// always gives the export a new host NQN, gives it a new password. The
// controller never derives the secret itself: RouterOS makes it of the
// password, and it is read back (rds.Client.SwapExportAuth).

// exportPasswordEncoding: lower-case base32 without padding, letters and
// digits only (rds.NewExportPassword).
var exportPasswordEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// exportPassword is the password of handle's export while it allows host.
func exportPassword(key []byte, handle, host string) (rds.ExportPassword, error) {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("rds-csi export password v1\x00" + handle + "\x00" + host))
	return rds.NewExportPassword(strings.ToLower(exportPasswordEncoding.EncodeToString(m.Sum(nil))))
}

// sealSecret seals an attachment's secret to the node's key
// (exportauth.Seal) with an ephemeral key derived from the attachment key,
// the volume, the host, the node's key and the secret: a repeated publish
// of the same attachment answers the same publish_context, as every
// repeated publish does, and a new secret or node key gives another.
func sealSecret(key []byte, handle, host string, to exportauth.PublicKey, secret nvme.DHCHAPSecret) (string, error) {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("rds-csi seal ephemeral v1\x00" + handle + "\x00" + host + "\x00" + to.String() + "\x00" + secret.Reveal()))
	return exportauth.Seal(secret, to, bytes.NewReader(m.Sum(nil)))
}
