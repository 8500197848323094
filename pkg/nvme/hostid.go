package nvme

import (
	"crypto/rand"
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
