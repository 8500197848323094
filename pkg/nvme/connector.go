package nvme

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// Connector is the node's view of a volume's transport: make the volume's
// block device appear, find it, and make it go away. TCPConnector (NVMe/TCP)
// and LoopConnector (tests) implement it. Consumers declare their own,
// possibly smaller, interface; this one documents the contract:
//
//   - Connect is idempotent: an NQN that is already connected with the same
//     host NQN is success, and the current device path is returned. It
//     waits for the device with ctx. A controller of the NQN connected with
//     another host NQN belongs to an earlier attachment: it is disconnected
//     first, never shared (TCPConnector; a loop device has no host).
//   - DevicePath resolves the NQN to its device now, without connecting, and
//     returns ErrNotConnected or ErrNoDevice when there is none. Device names
//     change across reconnects; callers must not cache them.
//   - Disconnect is idempotent (not connected is success), refuses NQNs
//     outside the driver's prefix (ErrForeignNQN), and disconnects only after
//     inUse has answered false (otherwise ErrInUse).
type Connector interface {
	Connect(ctx context.Context, t Target) (devicePath string, err error)
	Disconnect(ctx context.Context, nqn string, inUse InUseFunc) error
	DevicePath(ctx context.Context, nqn string) (string, error)
}

// SizeRefresher is implemented by connectors that can make the kernel re-read
// a namespace's size after the volume was expanded on the RDS.
type SizeRefresher interface {
	RefreshSize(ctx context.Context, nqn string) error
}

// Target is one RDS volume's NVMe/TCP export, and who connects to it.
type Target struct {
	Address string // the RDS data address: an IP, or a host name resolved at connect time
	Port    int    // NVMe/TCP service port; 0 means 4420
	NQN     string // the volume's subsystem NQN

	// HostNQN, when set, is the attachment's own host NQN (storage fencing
	// gives every attachment one, in ControllerPublish's publish_context):
	// the connect presents it, with the host ID AttachmentHostIdentity
	// derives from it. Empty: the node's own host NQN and host ID
	// (/etc/nvme), as for attachments made without one.
	HostNQN string

	// Secret, when set, is the attachment's DH-HMAC-CHAP secret: the
	// connect authenticates with it (dhchap_secret), and a kernel without
	// NVMe in-band authentication is refused before anything is tried
	// (ErrAuthUnsupported). Unset: no authentication, as before.
	Secret DHCHAPSecret
}

// InUseFunc reports whether any volume staged on this node still uses the
// subsystem nqn. Disconnect calls it after finding that the NQN is connected
// and before disconnecting; an error or true leaves the subsystem connected.
// It is a parameter rather than configuration so that every caller has to
// answer the question at the moment it matters.
type InUseFunc func(ctx context.Context, nqn string) (bool, error)

// DefaultPort is the IANA NVMe/TCP port.
const DefaultPort = 4420

const maxNQNLength = 223 // NVMe base specification limit

// nqnPattern admits no comma, '=' or whitespace, so a valid NQN cannot add
// options to the fabrics option string.
var nqnPattern = regexp.MustCompile(`^nqn\.[0-9]{4}-[0-9]{2}\.[A-Za-z0-9.-]+(:[A-Za-z0-9._:-]+)?$`)

// prefixPattern: the start of a valid NQN (date and naming authority), so a
// typo such as a missing "nqn." is caught at startup.
var prefixPattern = regexp.MustCompile(`^nqn\.[0-9]{4}-[0-9]{2}\.[A-Za-z0-9._:-]+$`)

func validateNQN(nqn string) error {
	if len(nqn) > maxNQNLength || !nqnPattern.MatchString(nqn) {
		return fmt.Errorf("%w: %q is not a valid NVMe qualified name", ErrInvalidArgument, nqn)
	}
	return nil
}

// nqnGuard is the prefix check shared by both connectors.
type nqnGuard struct{ prefix string }

func newNQNGuard(prefix string) (nqnGuard, error) {
	if prefix == "" {
		return nqnGuard{}, fmt.Errorf("%w: the driver's NQN prefix must be configured (e.g. nqn.2000-02.com.mikrotik:pvc-)", ErrInvalidArgument)
	}
	if len(prefix) >= maxNQNLength || !prefixPattern.MatchString(prefix) {
		return nqnGuard{}, fmt.Errorf("%w: NQN prefix %q does not start a valid NQN", ErrInvalidArgument, prefix)
	}
	return nqnGuard{prefix: prefix}, nil
}

// check validates nqn and refuses NQNs this driver did not create.
func (g nqnGuard) check(nqn string) error {
	if err := validateNQN(nqn); err != nil {
		return err
	}
	if !strings.HasPrefix(nqn, g.prefix) || len(nqn) == len(g.prefix) {
		return fmt.Errorf("%w: %q does not start with the configured prefix %q; refusing to touch it", ErrForeignNQN, nqn, g.prefix)
	}
	return nil
}

// keyedMutex serializes operations per NQN. Waiting honours ctx.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedEntry
}

type keyedEntry struct {
	sem  chan struct{}
	refs int
}

// lock acquires key's lock and returns the function that releases it.
func (k *keyedMutex) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = make(map[string]*keyedEntry)
	}
	e := k.locks[key]
	if e == nil {
		e = &keyedEntry{sem: make(chan struct{}, 1)}
		k.locks[key] = e
	}
	e.refs++
	k.mu.Unlock()

	var once sync.Once
	unlock := func() { once.Do(func() { <-e.sem; k.release(key, e) }) }
	// A free lock is taken even if ctx has ended: the operation then fails
	// on ctx itself, with a better message than "waiting for the lock".
	select {
	case e.sem <- struct{}{}:
		return unlock, nil
	default:
	}
	select {
	case e.sem <- struct{}{}:
		return unlock, nil
	case <-ctx.Done():
		k.release(key, e)
		return nil, fmt.Errorf("waiting for another operation on %s: %w", key, ctx.Err())
	}
}

func (k *keyedMutex) release(key string, e *keyedEntry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e.refs--
	if e.refs == 0 {
		delete(k.locks, key)
	}
}
