package rdssim

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// LoadOrGenerateHostKey loads the SSH host key at path (any key format
// x/crypto/ssh parses), or, when there is no file, generates an ed25519 key
// and stores it there in OpenSSH PEM format (mode 0600), so the simulator
// keeps its identity across restarts and pinned known_hosts entries stay
// valid.
func LoadOrGenerateHostKey(path string) (ssh.Signer, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		signer, err := ssh.ParsePrivateKey(data)
		if err != nil {
			if _, _, _, _, perr := ssh.ParseAuthorizedKey(data); perr == nil {
				return nil, fmt.Errorf("host key %s holds a public key; --host-key wants the host's private key (a file without .pub, or none: one is generated)", path)
			}
			return nil, fmt.Errorf("parse host key %s: %w", path, err)
		}
		return signer, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read host key: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "rds-sim host key")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create host key directory: %w", err)
	}
	// Write to a temporary name and link it into place, so a concurrent
	// start never sees a half-written key and never replaces a key that
	// another process has just stored.
	tmp, err := os.CreateTemp(filepath.Dir(path), simFilePrefix+"-hostkey-*")
	if err != nil {
		return nil, fmt.Errorf("store host key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(pem.EncodeToMemory(block)); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("store host key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("store host key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("store host key: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return LoadOrGenerateHostKey(path)
		}
		return nil, fmt.Errorf("store host key: %w", err)
	}
	return ssh.NewSignerFromKey(priv)
}

// NewTestKeys generates a fresh ed25519 client key: the signer for an
// ssh.ClientConfig and the public key for Config.AuthorizedKeys.
func NewTestKeys() (ssh.Signer, ssh.PublicKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, nil, err
	}
	return signer, signer.PublicKey(), nil
}

// LoadAuthorizedKeys reads an OpenSSH authorized_keys file. Options on a
// line are ignored; a file without keys is an error.
func LoadAuthorizedKeys(path string) ([]ssh.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read authorized keys: %w", err)
	}
	if _, err := ssh.ParseRawPrivateKey(data); err == nil || bytes.Contains(data, []byte("PRIVATE KEY-----")) {
		return nil, fmt.Errorf("%s is a private key; --authorized-keys wants public keys (authorized_keys lines, such as the key's .pub file)", path)
	}
	var keys []ssh.PublicKey
	for len(data) > 0 {
		key, _, _, rest, err := ssh.ParseAuthorizedKey(data)
		if err != nil {
			if len(keys) > 0 && len(rest) == 0 {
				break // trailing comments or blank lines
			}
			return nil, fmt.Errorf("parse authorized keys %s: %w", path, err)
		}
		keys = append(keys, key)
		data = rest
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no keys in %s", path)
	}
	return keys, nil
}

// WriteKnownHosts writes a known_hosts file that pins this server's host
// key for addrs (default: the address it listens on), for clients that
// verify host keys with x/crypto/ssh/knownhosts or OpenSSH.
func (s *Server) WriteKnownHosts(path string, addrs ...string) error {
	if len(addrs) == 0 {
		a := s.Addr()
		if a == "" {
			return errors.New("rdssim: server is not listening; pass the address")
		}
		addrs = []string{a}
	}
	line := knownhosts.Line(addrs, s.hostKey.PublicKey()) + "\n"
	return os.WriteFile(path, []byte(line), 0o644)
}

// WriteClientKey generates a fresh ed25519 client key, stores it at path
// as an unencrypted OpenSSH private key (mode 0600: what a driver's
// --rds-key-file points at) and returns its public key for
// Config.AuthorizedKeys.
func WriteClientKey(path, comment string) (ssh.PublicKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, fmt.Errorf("store client key: %w", err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, err
	}
	return signer.PublicKey(), nil
}
