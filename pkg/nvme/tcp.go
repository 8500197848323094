package nvme

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// Config configures a TCPConnector. Only NQNPrefix is required; the paths
// exist so that tests (and containers with host paths mounted elsewhere) can
// point the connector at another tree.
type Config struct {
	// NQNPrefix: the connector acts only on NQNs that start with it, e.g.
	// "nqn.2000-02.com.mikrotik:pvc-". Required.
	NQNPrefix string

	SysRoot     string // default /sys
	DevRoot     string // default /dev
	EtcNVMeDir  string // holds hostnqn and hostid; default /etc/nvme
	FabricsPath string // default /dev/nvme-fabrics

	// Runner loads the nvme-tcp kernel module ("modprobe nvme-tcp") when the
	// fabrics device is missing. Default ExecRunner.
	Runner Runner
	// Resolver turns a host name in Target.Address into an IP address (the
	// kernel takes numeric addresses only). Default net.DefaultResolver.
	Resolver interface {
		LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	}

	// CtrlLossTimeout: how long the kernel keeps reconnecting a lost
	// controller before it gives up, fails all I/O and removes the device.
	// Default 5m (DefaultCtrlLossTimeout): longer than an RDS reboot, so a
	// healthy attachment survives one (docs/node.md); negative means
	// reconnect forever. Whole seconds, rounded up.
	CtrlLossTimeout time.Duration
	// ReconnectDelay between reconnect attempts. Default 5s.
	ReconnectDelay time.Duration
	// FastIOFailTimeout: how long I/O waits on a controller that lost its
	// connection before it fails with an error, while the kernel keeps
	// reconnecting until CtrlLossTimeout (the kernel's fast_io_fail_tmo).
	// Zero: DefaultFastIOFailTimeout, or CtrlLossTimeout when that is
	// shorter. FailIOAtOnce fails I/O as soon as the connection is lost
	// (fast_io_fail_tmo=0). HoldIOUntilCtrlLoss passes nothing (the
	// kernel's default, needed on kernels before 5.10, which lack the
	// option): I/O waits for the whole CtrlLossTimeout. A fenced
	// attachment's writes can never land (its host NQN is refused for
	// good), so this bounds how long its application waits for the error;
	// the price is that an RDS outage longer than it fails I/O that would
	// have completed after the reconnect. Whole seconds, rounded up.
	FastIOFailTimeout time.Duration
	// KeepAliveTimeout for the admin queue. Default 5s (the kernel's default).
	KeepAliveTimeout time.Duration
	// PollInterval between sysfs scans while waiting for a device. Default
	// 100ms. Waiting itself is bounded only by the caller's context.
	PollInterval time.Duration
}

// Defaults for Config. docs/node.md says why these timers.
const (
	DefaultCtrlLossTimeout   = 5 * time.Minute
	DefaultFastIOFailTimeout = 30 * time.Second
	DefaultReconnectDelay    = 5 * time.Second
	DefaultKeepAliveTimeout  = 5 * time.Second
	DefaultPollInterval      = 100 * time.Millisecond
)

// Special values of Config.FastIOFailTimeout.
const (
	// FailIOAtOnce: I/O fails as soon as the connection is lost
	// (fast_io_fail_tmo=0).
	FailIOAtOnce time.Duration = -1
	// HoldIOUntilCtrlLoss: fast_io_fail_tmo is not passed; I/O waits until
	// the reconnect or CtrlLossTimeout.
	HoldIOUntilCtrlLoss time.Duration = -2
)

// TCPConnector connects this node to RDS volumes over NVMe/TCP.
//
// It writes the connect option string to /dev/nvme-fabrics itself rather than
// running nvme-cli: the node image needs no nvme-cli (whose flags, exit codes,
// "already connected" handling and config-file side effects such as
// /etc/nvme/config.json differ between 1.x and 2.x), the kernel answers with
// an exact errno (EALREADY for a duplicate), and the whole contract is one
// write that tests check in a plain file.
type TCPConnector struct {
	cfg   Config
	guard nqnGuard
	sys   sysfs
	locks keyedMutex

	idMu sync.Mutex
	id   *HostIdentity

	// kernel, when set by tests, plays the kernel's part after the option
	// string reached the fabrics file: it may create the sysfs tree and
	// return the errno the kernel would.
	kernel func(options string) error
	// discover lists the subsystems the target at addr:port offers this
	// host (offeredSubsystems; tests replace it).
	discover func(ctx context.Context, addr string, port int, id HostIdentity) ([]string, error)
}

var _ Connector = (*TCPConnector)(nil)
var _ SizeRefresher = (*TCPConnector)(nil)

// NewTCPConnector validates cfg and fills in defaults. It does no I/O.
func NewTCPConnector(cfg Config) (*TCPConnector, error) {
	guard, err := newNQNGuard(cfg.NQNPrefix)
	if err != nil {
		return nil, err
	}
	if cfg.SysRoot == "" {
		cfg.SysRoot = "/sys"
	}
	if cfg.DevRoot == "" {
		cfg.DevRoot = "/dev"
	}
	if cfg.EtcNVMeDir == "" {
		cfg.EtcNVMeDir = defaultEtcNVMe
	}
	if cfg.FabricsPath == "" {
		cfg.FabricsPath = "/dev/nvme-fabrics"
	}
	if cfg.Runner == nil {
		cfg.Runner = ExecRunner{}
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.CtrlLossTimeout == 0 {
		cfg.CtrlLossTimeout = DefaultCtrlLossTimeout
	}
	if cfg.ReconnectDelay == 0 {
		cfg.ReconnectDelay = DefaultReconnectDelay
	}
	if cfg.KeepAliveTimeout == 0 {
		cfg.KeepAliveTimeout = DefaultKeepAliveTimeout
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.FastIOFailTimeout == 0 {
		cfg.FastIOFailTimeout = DefaultFastIOFailTimeout
		if cfg.CtrlLossTimeout > 0 && cfg.CtrlLossTimeout < cfg.FastIOFailTimeout {
			cfg.FastIOFailTimeout = cfg.CtrlLossTimeout
		}
	}
	if cfg.ReconnectDelay < 0 || cfg.KeepAliveTimeout < 0 {
		return nil, fmt.Errorf("%w: reconnect delay and keep-alive timeout must be positive", ErrInvalidArgument)
	}
	if cfg.CtrlLossTimeout > 0 && cfg.CtrlLossTimeout < cfg.ReconnectDelay {
		return nil, fmt.Errorf("%w: ctrl loss timeout %v is shorter than the reconnect delay %v: the kernel would never reconnect", ErrInvalidArgument, cfg.CtrlLossTimeout, cfg.ReconnectDelay)
	}
	if cfg.FastIOFailTimeout < 0 && cfg.FastIOFailTimeout != FailIOAtOnce && cfg.FastIOFailTimeout != HoldIOUntilCtrlLoss {
		return nil, fmt.Errorf("%w: fast I/O fail timeout %v: want 0 (the default), FailIOAtOnce, HoldIOUntilCtrlLoss or a positive duration", ErrInvalidArgument, cfg.FastIOFailTimeout)
	}
	if cfg.CtrlLossTimeout > 0 && cfg.FastIOFailTimeout > cfg.CtrlLossTimeout {
		return nil, fmt.Errorf("%w: fast I/O fail timeout %v is longer than the ctrl loss timeout %v: I/O would fail at ctrl loss anyway", ErrInvalidArgument, cfg.FastIOFailTimeout, cfg.CtrlLossTimeout)
	}
	c := &TCPConnector{cfg: cfg, guard: guard, sys: sysfs{root: cfg.SysRoot}}
	c.discover = c.offeredSubsystems
	return c, nil
}

// HostIdentity returns this node's host NQN and host ID, creating and
// persisting them on first use if the node has none.
func (c *TCPConnector) HostIdentity() (HostIdentity, error) {
	c.idMu.Lock()
	defer c.idMu.Unlock()
	if c.id != nil {
		return *c.id, nil
	}
	id, err := LoadOrCreateHostIdentity(c.cfg.EtcNVMeDir)
	if err != nil {
		return HostIdentity{}, err
	}
	c.id = &id
	return id, nil
}

// Connect connects t.NQN as t's host (unless a live controller of that
// host already exists) and waits, bounded by ctx, for the namespace block
// device. Controllers of t.NQN connected as another host are disconnected
// first (removeEarlierAttachments).
func (c *TCPConnector) Connect(ctx context.Context, t Target) (string, error) {
	if err := c.guard.check(t.NQN); err != nil {
		return "", err
	}
	port := t.Port
	if port == 0 {
		port = DefaultPort
	}
	if port < 1 || port > 65535 {
		return "", fmt.Errorf("%w: port %d for %s", ErrInvalidArgument, t.Port, t.NQN)
	}
	id, err := c.hostFor(t)
	if err != nil {
		return "", fmt.Errorf("connecting %s: %w", t.NQN, err)
	}
	if !t.Secret.IsZero() {
		if why := c.AuthUnsupported(); why != "" {
			return "", fmt.Errorf("%w: connecting %s needs NVMe in-band authentication (the attachment has a DH-HMAC-CHAP secret) and %s", ErrAuthUnsupported, t.NQN, why)
		}
	}
	logger := klog.FromContext(ctx).WithValues("nqn", t.NQN)

	unlock, err := c.locks.lock(ctx, t.NQN)
	if err != nil {
		return "", err
	}
	defer func() { unlock() }()

	if err := c.removeEarlierAttachments(ctx, t.NQN, id); err != nil {
		return "", err
	}
	st, err := c.sys.lookup(t.NQN)
	if err != nil {
		return "", err
	}
	if st.live() {
		if err := c.sameTarget(ctx, st, t.Address, port); err != nil {
			return "", fmt.Errorf("connecting %s: %w", t.NQN, err)
		}
		logger.V(4).Info("already connected", "controllers", controllerNames(st.controllers))
		c.hideSecrets(ctx, t.NQN, id)
		return c.waitForDevice(ctx, t.NQN)
	}

	addr, err := c.resolve(ctx, t.Address)
	if err != nil {
		return "", fmt.Errorf("connecting %s: %w", t.NQN, err)
	}
	opts := c.options(addr, port, t.NQN, id, t.Secret)

	results, err := c.startFabricsWrite(ctx, opts)
	if err != nil {
		return "", fmt.Errorf("connecting %s to %s: %w", t.NQN, net.JoinHostPort(addr, strconv.Itoa(port)), err)
	}
	fresh := false
	select {
	case r := <-results:
		switch {
		case r.err == nil:
			fresh = true
			logger.Info("connected", "address", addr, "port", port, "as", c.hostLabel(id.NQN), "reply", r.reply)
		case errors.Is(r.err, syscall.EALREADY):
			logger.Info("kernel reports the controller already exists", "address", addr, "port", port)
		default:
			return "", c.connectError(ctx, t, addr, port, id, r.err)
		}
		c.hideSecrets(ctx, t.NQN, id)
	case <-ctx.Done():
		// The kernel's connect cannot be interrupted. Keep this NQN locked
		// until it returns, so nothing can slip in between, and take down
		// a controller it made after all: the caller was told the connect
		// failed, so nobody would stage or disconnect it (the CO's retry
		// connects afresh).
		held := unlock
		unlock = func() {}
		go func() {
			defer held()
			r := <-results
			logger.Info("connect attempt finished after its caller gave up", "err", r.err)
			if r.err == nil {
				if err := c.deleteControllers(context.Background(), t.NQN); err != nil {
					logger.Error(err, "removing the controller of a connect whose caller gave up")
				}
			}
		}()
		return "", fmt.Errorf("connecting %s to %s: %w", t.NQN, net.JoinHostPort(addr, strconv.Itoa(port)), ctx.Err())
	}
	dev, err := c.waitForDevice(ctx, t.NQN)
	if err != nil && fresh {
		// The caller is told the connect failed and will not disconnect a
		// controller whose namespace never showed up: take it down, so a
		// retry starts clean.
		if derr := c.deleteControllers(context.WithoutCancel(ctx), t.NQN); derr != nil {
			logger.Error(derr, "removing the controller of a connect that found no namespace")
		}
	}
	return dev, err
}

// hideSecrets leaves the DH-HMAC-CHAP secrets of nqn's controllers
// connected as id to root. Linux shows a controller's secrets in sysfs
// (dhchap_secret, dhchap_ctrl_secret) readable by every user, next to its
// hostnqn, and sysfs is not namespaced: any process or pod on the node
// could read both and connect as the attachment from another host. The
// kernel keeps an attribute's mode for the controller's life (reconnects
// included). A controller made without a secret shows "none"; it is
// hidden all the same. Failures are logged, never the value: the
// controller is connected either way.
func (c *TCPConnector) hideSecrets(ctx context.Context, nqn string, id HostIdentity) {
	logger := klog.FromContext(ctx).WithValues("nqn", nqn)
	st, err := c.sys.lookup(nqn)
	if err != nil {
		logger.Error(err, "listing controllers to hide their DH-HMAC-CHAP secrets in sysfs")
		return
	}
	for _, ctrl := range st.controllers {
		if host, ok, err := c.sys.controllerHostNQN(ctrl.name); err != nil || !ok || host != id.NQN {
			continue
		}
		if err := c.sys.restrictSecrets(ctrl.name); err != nil {
			logger.Error(err, "the controller's DH-HMAC-CHAP secret stays readable by every user on the node", "controller", ctrl.name)
		}
	}
}

// hostFor is the identity t is connected with: the attachment's own host
// NQN (with the host ID derived from it) when t names one, else the
// node's.
func (c *TCPConnector) hostFor(t Target) (HostIdentity, error) {
	own, err := c.HostIdentity()
	if err != nil {
		return HostIdentity{}, fmt.Errorf("host identity: %w", err)
	}
	if t.HostNQN == "" || t.HostNQN == own.NQN {
		return own, nil
	}
	id, err := AttachmentHostIdentity(t.HostNQN)
	if err != nil {
		return HostIdentity{}, err
	}
	if id.ID == own.ID {
		return HostIdentity{}, fmt.Errorf("%w: the attachment's host NQN maps to host ID %s, this node's own (%s); the kernel refuses one host ID under two host NQNs", ErrInvalidArgument, id.ID, filepath.Join(c.cfg.EtcNVMeDir, hostIDFile))
	}
	return id, nil
}

// hostLabel names a host NQN for logs and errors. The node's own NQN is
// public (it is in the node ID); an attachment's is its fencing token, so
// only a fingerprint of it is shown.
func (c *TCPConnector) hostLabel(nqn string) string {
	if own, err := c.HostIdentity(); err == nil && nqn == own.NQN {
		return "this node's host NQN " + nqn
	}
	sum := sha256.Sum256([]byte(nqn))
	return fmt.Sprintf("attachment host NQN sha256:%x", sum[:6])
}

// removeEarlierAttachments disconnects every controller of subsystem nqn
// that connected as another host than id, and waits, bounded by ctx, until
// all of them have left sysfs. Such a controller belongs to an earlier
// attachment of the volume: one fenced since (still reconnecting, its
// writes queued), or one made before the upgrade on the node's own NQN.
// The new controller would join its kernel subsystem, and with native
// multipath its namespace head, where the old attachment's queued writes
// are requeued onto the new, live path and land. The caller holds nqn's
// lock.
func (c *TCPConnector) removeEarlierAttachments(ctx context.Context, nqn string, id HostIdentity) error {
	logger := klog.FromContext(ctx).WithValues("nqn", nqn)
	asked := map[string]bool{}
	var ticker *time.Ticker
	for {
		st, err := c.sys.lookup(nqn)
		if err != nil {
			return err
		}
		var left, unknown []string
		for _, ctrl := range st.controllers {
			host, ok, err := c.sys.controllerHostNQN(ctrl.name)
			if errors.Is(err, errNoHostNQN) {
				// Whose it is cannot be told: neither shared nor deleted.
				unknown = append(unknown, ctrl.name)
				continue
			}
			if err != nil {
				return fmt.Errorf("connecting %s: %w", nqn, err)
			}
			if !ok || host == id.NQN {
				continue
			}
			left = append(left, ctrl.name)
			if asked[ctrl.name] || strings.HasPrefix(ctrl.state, stateDeleting) {
				continue // on its way out
			}
			if got, err := c.sys.controllerNQN(ctrl.name); err != nil || got != nqn {
				continue // gone or renumbered since the scan; the next one tells
			}
			asked[ctrl.name] = true
			err = c.sys.writeControllerAttr(ctrl.name, "delete_controller")
			switch {
			case err == nil:
				logger.Info("disconnected a controller of an earlier attachment before connecting a new one: they never share a controller or multipath head, so writes the old one holds cannot reach the volume",
					"controller", ctrl.name, "state", ctrl.state, "itsHost", c.hostLabel(host), "connectingAs", c.hostLabel(id.NQN))
			case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.EBUSY):
				// Gone, or already being deleted: wait for it below.
			default:
				return fmt.Errorf("connecting %s: disconnecting controller %s of an earlier attachment (%s): %w", nqn, ctrl.name, c.hostLabel(host), err)
			}
		}
		if len(left) == 0 && len(unknown) == 0 {
			return nil
		}
		if ticker == nil {
			ticker = time.NewTicker(c.cfg.PollInterval)
			defer ticker.Stop()
		}
		select {
		case <-ctx.Done():
			if len(left) == 0 {
				return fmt.Errorf("connecting %s: controller(s) %v of the subsystem show no hostnqn in sysfs, so whether they belong to an earlier attachment cannot be told (a kernel without the attribute?); refusing to share them: %w", nqn, unknown, ctx.Err())
			}
			return fmt.Errorf("connecting %s: controller(s) %v of an earlier attachment are still being removed; the new attachment must not share them: %w", nqn, append(left, unknown...), ctx.Err())
		case <-ticker.C:
		}
	}
}

// DevicePath returns /dev/<namespace> for nqn as sysfs shows it now.
func (c *TCPConnector) DevicePath(ctx context.Context, nqn string) (string, error) {
	if err := validateNQN(nqn); err != nil {
		return "", err
	}
	st, err := c.sys.lookup(nqn)
	if err != nil {
		return "", err
	}
	return c.pickDevice(nqn, st)
}

// IsConnected reports whether a controller for nqn exists and is not being
// deleted. It may be live or reconnecting.
func (c *TCPConnector) IsConnected(_ context.Context, nqn string) (bool, error) {
	if err := validateNQN(nqn); err != nil {
		return false, err
	}
	st, err := c.sys.lookup(nqn)
	if err != nil {
		return false, err
	}
	return len(activeControllers(st.controllers)) > 0, nil
}

// Paths reports how many controllers (paths) nqn has that are not being
// deleted, and how many of them are live. Fewer live than total means the
// kernel is reconnecting: I/O on the device waits (up to ctrl_loss_tmo).
func (c *TCPConnector) Paths(_ context.Context, nqn string) (live, total int, err error) {
	if err := validateNQN(nqn); err != nil {
		return 0, 0, err
	}
	st, err := c.sys.lookup(nqn)
	if err != nil {
		return 0, 0, err
	}
	for _, ctrl := range activeControllers(st.controllers) {
		total++
		if ctrl.state == stateLive {
			live++
		}
	}
	return live, total, nil
}

// Disconnect deletes every controller of subsystem nqn, after inUse has
// confirmed no staged volume uses it. Not connected is success. Controllers
// of other subsystems are never written to.
func (c *TCPConnector) Disconnect(ctx context.Context, nqn string, inUse InUseFunc) error {
	if err := c.guard.check(nqn); err != nil {
		return err
	}
	if inUse == nil {
		return fmt.Errorf("%w: disconnecting %s needs an in-use check", ErrInvalidArgument, nqn)
	}
	logger := klog.FromContext(ctx).WithValues("nqn", nqn)

	unlock, err := c.locks.lock(ctx, nqn)
	if err != nil {
		return err
	}
	defer unlock()

	st, err := c.sys.lookup(nqn)
	if err != nil {
		return err
	}
	ctrls := activeControllers(st.controllers)
	if len(ctrls) == 0 {
		logger.V(4).Info("not connected; nothing to disconnect")
		return nil
	}
	busy, err := inUse(ctx, nqn)
	if err != nil {
		return fmt.Errorf("disconnecting %s: in-use check: %w", nqn, err)
	}
	if busy {
		return fmt.Errorf("%w: %s is still used by a staged volume on this node; unstage it first", ErrInUse, nqn)
	}
	return c.deleteControllers(ctx, nqn)
}

// deleteControllers deletes every active controller of nqn. The caller
// holds nqn's lock.
func (c *TCPConnector) deleteControllers(ctx context.Context, nqn string) error {
	logger := klog.FromContext(ctx).WithValues("nqn", nqn)
	st, err := c.sys.lookup(nqn)
	if err != nil {
		return err
	}
	for _, ctrl := range activeControllers(st.controllers) {
		got, err := c.sys.controllerNQN(ctrl.name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("disconnecting %s: %w", nqn, err)
		}
		if got != nqn {
			logger.Info("controller changed subsystem since the scan; leaving it alone", "controller", ctrl.name, "now", got)
			continue
		}
		if err := c.sys.writeControllerAttr(ctrl.name, "delete_controller"); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // deleted meanwhile (ctrl_loss_tmo expired, or another caller)
			}
			return fmt.Errorf("disconnecting %s: deleting controller %s: %w", nqn, ctrl.name, err)
		}
		logger.Info("deleted controller", "controller", ctrl.name)
	}
	return nil
}

// RefreshSize asks each live controller of nqn to rescan its namespaces, so
// the kernel picks up a size change even if the target sent no
// namespace-changed notice.
func (c *TCPConnector) RefreshSize(ctx context.Context, nqn string) error {
	if err := c.guard.check(nqn); err != nil {
		return err
	}
	st, err := c.sys.lookup(nqn)
	if err != nil {
		return err
	}
	var done int
	for _, ctrl := range st.controllers {
		if ctrl.state != stateLive {
			continue
		}
		if got, err := c.sys.controllerNQN(ctrl.name); err != nil || got != nqn {
			continue
		}
		if err := c.sys.writeControllerAttr(ctrl.name, "rescan_controller"); err != nil {
			return fmt.Errorf("rescanning %s via %s: %w", nqn, ctrl.name, err)
		}
		done++
	}
	if done == 0 {
		return fmt.Errorf("%w: %s has no live controller to rescan", ErrNotConnected, nqn)
	}
	klog.FromContext(ctx).V(4).Info("rescanned namespaces", "nqn", nqn, "controllers", done)
	return nil
}

// options builds the fabrics option string. Every value in it has been
// validated (NQNs, numeric address, port, UUID, the secret's DHHC-1 form,
// whose base64 has no comma), so none can add options. The string holds
// the secret: it goes to the kernel only, never into a log or an error.
func (c *TCPConnector) options(addr string, port int, nqn string, id HostIdentity, secret DHCHAPSecret) string {
	opts := fmt.Sprintf("transport=tcp,traddr=%s,trsvcid=%d,nqn=%s,hostnqn=%s,hostid=%s,ctrl_loss_tmo=%d,reconnect_delay=%d,keep_alive_tmo=%d",
		addr, port, nqn, id.NQN, id.ID,
		kernelSeconds(c.cfg.CtrlLossTimeout), kernelSeconds(c.cfg.ReconnectDelay), kernelSeconds(c.cfg.KeepAliveTimeout))
	switch {
	case c.cfg.FastIOFailTimeout == FailIOAtOnce:
		opts += ",fast_io_fail_tmo=0"
	case c.cfg.FastIOFailTimeout > 0:
		opts += fmt.Sprintf(",fast_io_fail_tmo=%d", kernelSeconds(c.cfg.FastIOFailTimeout))
	} // HoldIOUntilCtrlLoss: the kernel's default
	if !secret.IsZero() {
		opts += ",dhchap_secret=" + secret.Reveal()
	}
	return opts
}

// AuthUnsupported says why this node's kernel cannot authenticate an NVMe
// connect with DH-HMAC-CHAP, or "" when it can. Read without a controller,
// the fabrics device lists the connect options the kernel accepts (Linux
// 5.17+). From Linux 6.7 it lists dhchap_secret only when the kernel was
// built with CONFIG_NVME_HOST_AUTH; from 6.0 to 6.6 it lists it always,
// and only a kernel built with CONFIG_NVME_AUTH has the nvme-common module
// that does the work. So: the option is listed, and the module that
// implements it (nvme_auth from 6.7, nvme_common before) is loaded, which
// nvme-core pulls in when the kernel has host authentication. A kernel
// that fails this is refused before the connect, never found out by one
// that hangs or fails later.
func (c *TCPConnector) AuthUnsupported() string {
	// No modprobe here (unlike a connect): the node plugin asks at start,
	// and a check must not load kernel modules.
	f, err := os.Open(c.cfg.FabricsPath)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Sprintf("%s is missing: the nvme-tcp kernel module is not loaded; load it at boot (list nvme-tcp in /etc/modules-load.d/) and restart the node plugin", c.cfg.FabricsPath)
	}
	if err != nil {
		return fmt.Sprintf("%s cannot be read (%v)", c.cfg.FabricsPath, err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	n, err := f.Read(buf)
	if n == 0 {
		return fmt.Sprintf("%s lists no connect options (%v): a kernel before Linux 5.17, which has no NVMe in-band authentication either", c.cfg.FabricsPath, err)
	}
	if !strings.Contains(string(buf[:n]), "dhchap_secret=") {
		return fmt.Sprintf("the kernel does not accept dhchap_secret (%s): it was built without CONFIG_NVME_HOST_AUTH (Linux 6.7+) or CONFIG_NVME_AUTH (6.0 to 6.6), as Debian's 6.1 kernel is; boot a kernel with it, e.g. Debian bookworm's 6.12 from bookworm-security", c.cfg.FabricsPath)
	}
	// nvme_common (6.0 to 6.6) is also what nvmet's authentication
	// (CONFIG_NVME_TARGET_AUTH) loads: only nvme-core holding it shows
	// the host's. From 6.7 the option is listed only with host
	// authentication, so nvme_auth loaded is enough.
	for _, m := range []string{"nvme_auth", filepath.Join("nvme_common", "holders", "nvme_core")} {
		if _, err := os.Stat(filepath.Join(c.cfg.SysRoot, "module", m)); err == nil {
			return ""
		}
	}
	return "the kernel lists dhchap_secret but neither nvme_auth nor nvme_common is loaded for nvme-core: it was built without host authentication (CONFIG_NVME_AUTH on Linux 6.0 to 6.6)"
}

// kernelSeconds rounds up to whole seconds; negative means "forever" (-1).
func kernelSeconds(d time.Duration) int {
	if d < 0 {
		return -1
	}
	return int(math.Ceil(d.Seconds()))
}

// resolve returns a numeric address for the kernel.
func (c *TCPConnector) resolve(ctx context.Context, address string) (string, error) {
	if ip := net.ParseIP(address); ip != nil {
		return ip.String(), nil
	}
	if address == "" || strings.ContainsAny(address, ",= \t\r\n%/") {
		return "", fmt.Errorf("%w: target address %q is neither an IP address nor a host name", ErrInvalidArgument, address)
	}
	addrs, err := c.cfg.Resolver.LookupIPAddr(ctx, address)
	if err != nil {
		return "", fmt.Errorf("%w: resolving %q: %w", ErrTargetUnreachable, address, err)
	}
	for _, a := range addrs { // prefer IPv4, as RDS data ports usually are
		if a.IP.To4() != nil {
			return a.IP.String(), nil
		}
	}
	for _, a := range addrs {
		if a.Zone == "" {
			return a.IP.String(), nil
		}
	}
	return "", fmt.Errorf("%w: %q resolved to no usable address", ErrTargetUnreachable, address)
}

// sameTarget checks that the live controllers of an NQN are connected to
// the target at address and port: an NQN names a slot, not its RDS, so
// the same NQN at another target is another disk, whose device must not
// stand for this one. A controller whose address cannot be read, or a
// host name that cannot be resolved now, is not held against it.
func (c *TCPConnector) sameTarget(ctx context.Context, st nqnState, address string, port int) error {
	var want []string
	if ip := net.ParseIP(address); ip != nil {
		want = []string{ip.String()}
	} else if addrs, err := c.cfg.Resolver.LookupIPAddr(ctx, address); err == nil {
		for _, a := range addrs {
			want = append(want, a.IP.String())
		}
	}
	for _, ctrl := range st.controllers {
		if ctrl.state != stateLive {
			continue
		}
		attr, err := readAttr(filepath.Join(c.sys.controllerDir(ctrl.name), "address"))
		if err != nil {
			continue
		}
		traddr, trsvcid := "", ""
		for _, kv := range strings.Split(attr, ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
			switch k {
			case "traddr":
				traddr = v
			case "trsvcid":
				trsvcid = v
			}
		}
		if ip := net.ParseIP(traddr); ip != nil {
			traddr = ip.String()
		}
		if (trsvcid != "" && trsvcid != strconv.Itoa(port)) || (traddr != "" && len(want) > 0 && !slices.Contains(want, traddr)) {
			return fmt.Errorf("%w: %s is connected to %s port %s, not %s port %d: another RDS's disk of the same slot is staged on this node; unstage it first", ErrOtherTarget, ctrl.name, traddr, trsvcid, address, port)
		}
	}
	return nil
}

type fabricsResult struct {
	reply string // "instance=N,cntlid=M" from the real device
	err   error
}

// startFabricsWrite opens the fabrics device and writes opts in a goroutine:
// the kernel's connect blocks for as long as the TCP connect and the NVMe
// handshake take, and cannot be cancelled. The goroutine ends when the write
// returns; the result channel is buffered so nobody has to read it.
func (c *TCPConnector) startFabricsWrite(ctx context.Context, opts string) (<-chan fabricsResult, error) {
	f, err := c.openFabrics(ctx)
	if err != nil {
		return nil, err
	}
	results := make(chan fabricsResult, 1)
	go func() {
		defer f.Close()
		_, err := f.Write([]byte(opts))
		if err == nil && c.kernel != nil {
			err = c.kernel(opts)
		}
		var reply string
		if err == nil {
			// The real device answers on the same descriptor; a plain file
			// is at EOF here.
			buf := make([]byte, 256)
			if n, _ := f.Read(buf); n > 0 {
				reply = strings.TrimSpace(string(buf[:n]))
			}
		}
		results <- fabricsResult{reply: reply, err: err}
	}()
	return results, nil
}

func (c *TCPConnector) openFabrics(ctx context.Context) (*os.File, error) {
	f, err := os.OpenFile(c.cfg.FabricsPath, os.O_RDWR, 0)
	if !errors.Is(err, fs.ErrNotExist) {
		return f, err
	}
	// The device exists only while nvme-fabrics is loaded; nvme-tcp pulls it in.
	if _, merr := c.cfg.Runner.Run(ctx, "modprobe", "nvme-tcp"); merr != nil {
		return nil, fmt.Errorf("%w: %s is missing and loading nvme-tcp failed (load the nvme-tcp kernel module on the node): %w", ErrConnectFailed, c.cfg.FabricsPath, merr)
	}
	f, err = os.OpenFile(c.cfg.FabricsPath, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s is missing even after loading nvme-tcp; is /dev from the host mounted into the node plugin?", ErrConnectFailed, c.cfg.FabricsPath)
	}
	return f, err
}

func (c *TCPConnector) connectError(ctx context.Context, t Target, addr string, port int, id HostIdentity, err error) error {
	nqn := t.NQN
	target := net.JoinHostPort(addr, strconv.Itoa(port))
	if why := authRefusal(t, err); why != "" {
		return fmt.Errorf("%w: connecting %s at %s as %s: %w: %s", ErrAuthFailed, nqn, target, c.hostLabel(id.NQN), err, why)
	}
	if errors.Is(err, syscall.ECONNREFUSED) && !t.Secret.IsZero() && c.discover != nil {
		// Older Linux (before nvme-auth answered -EKEYREJECTED) answers a
		// rejected secret with ECONNREFUSED, as a TCP port nobody
		// listens on. A discovery answered on the same port tells
		// them apart.
		offered, derr := c.discover(ctx, addr, port, id)
		switch {
		case derr == nil && slices.Contains(offered, nqn):
			return fmt.Errorf("%w: connecting %s at %s as %s: %w (the target answers discovery on that port and offers the subsystem to this host, so it refused the authentication, not the connection): %s", ErrAuthFailed, nqn, target, c.hostLabel(id.NQN), err, secretRejected)
		case derr == nil:
			return fmt.Errorf("%w: the target at %s does not offer %s to this node as %s: the volume is not exported there, or this host is not its allowed host (a fenced or ended attachment's host NQN never is again); the target offers %d other subsystem(s) to it", ErrSubsystemNotFound, target, nqn, c.hostLabel(id.NQN), len(offered))
		}
		klog.FromContext(ctx).V(2).Info("discovery after a refused connect failed", "nqn", nqn, "err", derr)
	}
	for _, e := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ECONNRESET} {
		if errors.Is(err, e) {
			return fmt.Errorf("%w: connecting %s at %s: %w; check the RDS address and that the disk is exported on that port", ErrTargetUnreachable, nqn, target, err)
		}
	}
	// The kernel's fabrics code answers EINVAL for a transport it has no
	// module for, and for an option it does not know.
	if errors.Is(err, syscall.EINVAL) {
		if _, serr := os.Stat(filepath.Join(c.cfg.SysRoot, "module", "nvme_tcp")); errors.Is(serr, fs.ErrNotExist) {
			return fmt.Errorf("%w: connecting %s at %s: %w: the nvme-tcp kernel module is not loaded on this node; run `modprobe nvme-tcp` there (and list nvme-tcp in /etc/modules-load.d/ so it survives a reboot)", ErrConnectFailed, nqn, target, err)
		}
		if c.cfg.FastIOFailTimeout != HoldIOUntilCtrlLoss {
			return fmt.Errorf("%w: connecting %s at %s: %w; the node's kernel log (dmesg) has the reason: a kernel before Linux 5.10 does not know fast_io_fail_tmo (set --nvme-fast-io-fail-timeout=0 there)", ErrConnectFailed, nqn, target, err)
		}
	}
	// The target refused the connect. Ask its discovery controller whether
	// it offers the NQN to this host at all.
	if errors.Is(err, syscall.EIO) && c.discover != nil {
		offered, derr := c.discover(ctx, addr, port, id)
		if derr == nil && !slices.Contains(offered, nqn) {
			return fmt.Errorf("%w: the target at %s does not offer %s to this node as %s: the volume is not exported there, or this host is not its allowed host (a fenced or ended attachment's host NQN never is again); the target offers %d other subsystem(s) to it", ErrSubsystemNotFound, target, nqn, c.hostLabel(id.NQN), len(offered))
		}
		if derr != nil {
			klog.FromContext(ctx).V(2).Info("discovery after a refused connect failed", "nqn", nqn, "err", derr)
		}
		if derr == nil && !t.Secret.IsZero() {
			// Offered to this host, and it authenticates: seen in the VM
			// tier (Linux 6.12 nvmet, under load), a refused secret can
			// end so, after the kernel's 60 s admin timeout, when the
			// target drops the connection before its refusal arrives.
			return fmt.Errorf("%w: connecting %s at %s: %w; the target offers it to this host, so the likely reason is the DH-HMAC-CHAP secret: the target may have refused it and dropped the connection before saying so (the node's kernel log, dmesg, tells); a retry that is refused again says so", ErrConnectFailed, nqn, target, err)
		}
	}
	return fmt.Errorf("%w: connecting %s at %s: %w; the node's kernel log (dmesg) has the reason, e.g. an unknown NQN or a refused host NQN", ErrConnectFailed, nqn, target, err)
}

// authRefusal says why the kernel's connect error err is the target
// refusing NVMe in-band authentication, or "" when it is not. The
// kernel's host side (drivers/nvme/host/auth.c, fabrics.c) answers ENOKEY
// when the target requires authentication and the connect carried no
// dhchap_secret, and, when the target rejected the secret, EKEYREJECTED
// (kernels with "nvme-auth: return -EKEYREJECTED") or ECONNREFUSED
// before. ECONNREFUSED is also a TCP connect that nothing answered, so
// connectError takes it for a refused secret only when the connect
// carried one and the target's discovery answered on the same port.
func authRefusal(t Target, err error) string {
	switch {
	case isNoKey(err):
		return "the target requires NVMe in-band authentication (DH-HMAC-CHAP) and the attachment has no secret: the export has a password this attachment was not given (publish it again with authentication, or the attachment predates it)"
	case !t.Secret.IsZero() && isKeyRejected(err):
		return secretRejected
	}
	return ""
}

const secretRejected = "the target rejected the attachment's DH-HMAC-CHAP secret: the export's password changed since it was published (a fence or a move replaced it), so this attachment is no longer the export's holder"

// waitForDevice polls sysfs until the NQN has a usable block device or ctx
// ends. It checks once before the first tick.
func (c *TCPConnector) waitForDevice(ctx context.Context, nqn string) (string, error) {
	ticker := time.NewTicker(c.cfg.PollInterval)
	defer ticker.Stop()
	var last error
	for {
		st, err := c.sys.lookup(nqn)
		if err != nil {
			return "", err
		}
		path, err := c.pickDevice(nqn, st)
		if err == nil {
			return path, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for the block device of %s: %w (%w)", nqn, last, ctx.Err())
		case <-ticker.C:
		}
	}
}

// deviceReady reports whether a device node exists and opens: right after
// a connect (seen with nvme_core.multipath=N, a controller number just
// reused) the node can be there before its disk is live, and opening it
// fails with ENXIO for a moment; NodeStage would then fail on it. Errors
// other than "no such device" keep the node's mere existence as the test.
func deviceReady(path string) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err == nil {
		f.Close()
		return true
	}
	return !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENXIO) && !errors.Is(err, syscall.ENODEV)
}

// pickDevice chooses the device to hand out: a multipath head (or a
// namespace without multipath) before a single path, lowest namespace ID
// first, and only one whose /dev node exists.
func (c *TCPConnector) pickDevice(nqn string, st nqnState) (string, error) {
	if !st.connected() {
		return "", fmt.Errorf("%w: no NVMe subsystem or controller has NQN %s", ErrNotConnected, nqn)
	}
	for _, ns := range st.namespaces {
		path := filepath.Join(c.cfg.DevRoot, ns.name)
		if deviceReady(path) {
			return path, nil
		}
	}
	seen := make([]string, 0, len(st.namespaces))
	for _, ns := range st.namespaces {
		seen = append(seen, ns.name)
	}
	return "", fmt.Errorf("%w: %s is connected (subsystems %v, controllers %v) but has no namespace with a device node under %s (namespaces seen: %v); check that the RDS disk is exported",
		ErrNoDevice, nqn, st.subsystems, controllerNames(st.controllers), c.cfg.DevRoot, seen)
}

func activeControllers(all []controller) []controller {
	var out []controller
	for _, c := range all {
		if !strings.HasPrefix(c.state, stateDeleting) {
			out = append(out, c)
		}
	}
	return out
}

func controllerNames(cs []controller) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.name+"("+c.state+")")
	}
	return out
}
