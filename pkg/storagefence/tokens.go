package storagefence

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/rds"
)

// attachmentNQNPrefix is the plain form every initiator uses for a
// uuid-based host NQN.
const attachmentNQNPrefix = "nqn.2014-08.org.nvmexpress:uuid:"

// minAttachmentKey is the shortest attachment key accepted.
const minAttachmentKey = 32

// NewNonce returns a fresh claim nonce: 128 random bits in hex.
func NewNonce() (string, error) {
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

// HostOf is the host NQN the export allows for node's claim c on handle
// (HostNQN under this Fence's attachment key).
func (f *Fence) HostOf(handle, node string, c claims.Claim) string {
	return HostNQN(f.key, handle, node, c)
}

// HostNQN is the host NQN the export allows for node's claim c on handle,
// under the attachment key: the attachment's own NQN; for a claim made
// before per-attachment NQNs, the node's NQN it recorded; for one made
// before storage fencing, "" (any host, as it was).
func HostNQN(key []byte, handle, node string, c claims.Claim) string {
	if c.Nonce != "" {
		return attachmentNQN(key, handle, node, c.Nonce)
	}
	return c.HostNQN
}

// ParkedFrom reports whether host is a park of handle's export (an open
// state to a host nobody has, made on the way between two holders) made
// on the way from the host from.
func (f *Fence) ParkedFrom(handle, host, from string) bool {
	return parkedFrom(f.key, handle, host, from)
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

// exportPasswordEncoding: lower-case base32 without padding, letters and
// digits only (rds.NewExportPassword).
var exportPasswordEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// exportPassword is the password of handle's export while it allows host.
func exportPassword(key []byte, handle, host string) (rds.ExportPassword, error) {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("rds-csi export password v1\x00" + handle + "\x00" + host))
	return rds.NewExportPassword(strings.ToLower(exportPasswordEncoding.EncodeToString(m.Sum(nil))))
}
