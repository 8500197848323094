package nvme

import (
	"crypto/rand"
	"crypto/sha1"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// HostIdentity is how this node presents itself to NVMe-oF targets. It must
// be stable across reboots and driver restarts: the RDS (and any export
// restriction the controller sets up) sees the host NQN, and the kernel uses
// the host ID to tell hosts apart.
type HostIdentity struct {
	NQN string // e.g. nqn.2014-08.org.nvmexpress:uuid:<uuid>
	ID  string // a UUID
}

const (
	hostNQNFile    = "hostnqn"
	hostIDFile     = "hostid"
	uuidNQNPrefix  = "nqn.2014-08.org.nvmexpress:uuid:"
	defaultEtcNVMe = "/etc/nvme"
)

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// LoadOrCreateHostIdentity reads dir/hostnqn and dir/hostid (the files
// nvme-cli and the distributions use), creating whichever is missing:
//
//   - both missing: a new random UUID u gives hostnqn
//     nqn.2014-08.org.nvmexpress:uuid:u and hostid u;
//   - only hostid missing: the UUID in a UUID-form hostnqn, else a new UUID;
//   - only hostnqn missing: the UUID-form NQN of the existing hostid.
//
// Existing files are never rewritten (except an empty one). Creation is
// atomic and first-writer-wins, so two processes racing here agree.
func LoadOrCreateHostIdentity(dir string) (HostIdentity, error) {
	nqn, err := readIdentityFile(filepath.Join(dir, hostNQNFile))
	if err != nil {
		return HostIdentity{}, err
	}
	id, err := readIdentityFile(filepath.Join(dir, hostIDFile))
	if err != nil {
		return HostIdentity{}, err
	}
	id = strings.ToLower(id)
	if id != "" && !uuidPattern.MatchString(id) {
		return HostIdentity{}, fmt.Errorf("%w: %s holds %q, which is not a UUID; fix or remove it", ErrInvalidArgument, filepath.Join(dir, hostIDFile), id)
	}

	if nqn == "" {
		u := id
		if u == "" {
			if u, err = newUUID(); err != nil {
				return HostIdentity{}, err
			}
		}
		// Another process may win this race; then its NQN is ours.
		if nqn, err = createIdentityFile(dir, hostNQNFile, uuidNQNPrefix+u); err != nil {
			return HostIdentity{}, err
		}
	}
	if err := validateNQN(nqn); err != nil {
		return HostIdentity{}, fmt.Errorf("host NQN in %s: %w", filepath.Join(dir, hostNQNFile), err)
	}

	if id == "" {
		// Derived from the NQN as it is on disk now, so racing creators
		// end up with the same pair.
		if u, ok := strings.CutPrefix(strings.ToLower(nqn), uuidNQNPrefix); ok && uuidPattern.MatchString(u) {
			id = u
		} else if id, err = newUUID(); err != nil {
			return HostIdentity{}, err
		}
		if id, err = createIdentityFile(dir, hostIDFile, id); err != nil {
			return HostIdentity{}, err
		}
		id = strings.ToLower(id)
		if !uuidPattern.MatchString(id) {
			return HostIdentity{}, fmt.Errorf("%w: %s holds %q, which is not a UUID; fix or remove it", ErrInvalidArgument, filepath.Join(dir, hostIDFile), id)
		}
	}
	return HostIdentity{NQN: nqn, ID: id}, nil
}

// readIdentityFile returns the trimmed content, or "" if the file is missing.
func readIdentityFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// createIdentityFile writes value to dir/name unless another writer got
// there first, and returns what the file holds afterwards. The temp file is
// hard-linked into place, which fails if the name exists: no rename can
// replace an identity another process has already handed to the kernel.
func createIdentityFile(dir, name, value string) (string, error) {
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("creating %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(value + "\n"); err != nil {
		tmp.Close()
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	// An existing but empty file carries no identity; replace it. (A
	// missing file is left to os.Link, which loses to a concurrent creator.)
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == "" {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("replacing empty %s: %w", path, err)
		}
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("creating %s: %w", path, err)
	}
	cur, err := readIdentityFile(path)
	if err != nil {
		return "", err
	}
	if cur == "" {
		return "", fmt.Errorf("%s is empty after writing it", path)
	}
	return cur, nil
}

// newUUID returns a random (version 4) UUID.
func newUUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generating host ID: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// hostIDNamespace is the UUID namespace of host IDs derived from host NQNs
// that carry no UUID of their own (a fixed, random UUID: the derivation
// must give every node and every release the same ID for one NQN).
var hostIDNamespace = [16]byte{0x0c, 0xa6, 0x08, 0x9a, 0xc3, 0x82, 0x4f, 0xef, 0x95, 0x9c, 0x5d, 0x03, 0xbf, 0xe0, 0x66, 0x06}

// AttachmentHostIdentity is the identity one attachment connects with:
// the host NQN the controller derived for it under storage fencing, and
// a host ID that belongs to that NQN alone. The kernel refuses one host ID
// under two host NQNs (and one NQN under two IDs), so the node's own
// /etc/nvme/hostid is never paired with it:
//
//   - the UUID form nqn.2014-08.org.nvmexpress:uuid:<u> gets host ID u,
//     as nvme-cli derives it;
//   - any other NQN gets a name-based (version 5) UUID of the NQN, the
//     same on every node and every call.
//
// The NQN is validated strictly, since it goes into the fabrics option
// string. Errors never quote it: it is the attachment's fencing token, and
// error texts end up in events that more people can read.
func AttachmentHostIdentity(nqn string) (HostIdentity, error) {
	switch {
	case nqn == "":
		return HostIdentity{}, fmt.Errorf("%w: the attachment's host NQN is empty", ErrInvalidArgument)
	case len(nqn) > maxNQNLength:
		return HostIdentity{}, fmt.Errorf("%w: the attachment's host NQN is %d bytes, more than the %d an NQN may have", ErrInvalidArgument, len(nqn), maxNQNLength)
	case !nqnPattern.MatchString(nqn):
		return HostIdentity{}, fmt.Errorf("%w: the attachment's host NQN is not an NVMe qualified name (nqn.<yyyy-mm>.<reverse domain>[:<name>], no ',', '=' or whitespace)", ErrInvalidArgument)
	case strings.EqualFold(nqn, discoveryNQN):
		return HostIdentity{}, fmt.Errorf("%w: the attachment's host NQN is the discovery subsystem's NQN", ErrInvalidArgument)
	}
	if u, ok := strings.CutPrefix(nqn, uuidNQNPrefix); ok {
		u = strings.ToLower(u)
		if !uuidPattern.MatchString(u) {
			return HostIdentity{}, fmt.Errorf("%w: the attachment's host NQN has the UUID form's prefix (%s) but no UUID after it", ErrInvalidArgument, uuidNQNPrefix)
		}
		return HostIdentity{NQN: nqn, ID: u}, nil
	}
	return HostIdentity{NQN: nqn, ID: nameUUID(hostIDNamespace, nqn)}, nil
}

// nameUUID is the name-based, SHA-1 (version 5) UUID of name in namespace
// ns (RFC 9562, section 5.5).
func nameUUID(ns [16]byte, name string) string {
	h := sha1.New()
	h.Write(ns[:])
	h.Write([]byte(name))
	b := h.Sum(nil)[:16]
	b[6] = b[6]&0x0f | 0x50
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
