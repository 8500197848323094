package rdssim

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
)

// DefaultNvmetRoot is where the kernel's NVMe target appears once configfs
// is mounted and the nvmet module is loaded.
const DefaultNvmetRoot = "/sys/kernel/config/nvmet"

// NvmetModel marks the simulator's subsystems: it is written to each
// subsystem's attr_model when the simulator creates it, and Reconcile only
// ever changes or removes subsystems that carry it.
const NvmetModel = "rds-sim"

// ErrNoNvmet: configfs with the nvmet module is not available.
var ErrNoNvmet = errors.New("the kernel NVMe target (nvmet in configfs) is not available")

// NvmetConfig configures an NvmetExporter.
type NvmetConfig struct {
	// Root is the nvmet configfs directory; default DefaultNvmetRoot.
	// Tests point it at a plain directory.
	Root string
	// Address is the IP address the simulator's NVMe/TCP ports listen on;
	// default 127.0.0.1.
	Address string
	// Logger; the zero value discards.
	Logger klog.Logger
}

// NvmetExporter exports disks through the Linux kernel's NVMe/TCP target:
// one subsystem per exported disk (its NQN), namespace 1 on the disk's
// backing file, linked to one tcp port per nvme-tcp-server-port (the
// port's configfs ID is the TCP port number), with allowed_hosts set from
// nvme-tcp-server-allow-host-name.
//
// A namespace is opened with O_DIRECT first and falls back to buffered I/O
// where the backing filesystem refuses O_DIRECT (tmpfs).
//
// Ownership: a subsystem is the simulator's when its attr_model is
// NvmetModel; a port is when its ID equals its tcp service port and it
// listens on Address. Nothing else in configfs is changed or removed, and a
// subsystem or port that has a wanted name but belongs to someone else is
// an error.
type NvmetExporter struct {
	root string
	addr string
	log  klog.Logger
	// onUnlink, when set (tests), is called after a subsystem's link to a
	// port was removed: the moment its established connections drop.
	onUnlink func(port, nqn string)
}

var _ Exporter = (*NvmetExporter)(nil)

// NewNvmetExporter checks that root is an nvmet configfs tree (it has
// subsystems/, ports/ and hosts/).
func NewNvmetExporter(cfg NvmetConfig) (*NvmetExporter, error) {
	if cfg.Root == "" {
		cfg.Root = DefaultNvmetRoot
	}
	if cfg.Address == "" {
		cfg.Address = "127.0.0.1"
	}
	ip := net.ParseIP(cfg.Address)
	if ip == nil {
		return nil, fmt.Errorf("nvmet listen address %q is not an IP address", cfg.Address)
	}
	for _, d := range []string{"subsystems", "ports", "hosts"} {
		if fi, err := os.Stat(filepath.Join(cfg.Root, d)); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%w: %s/%s is missing; load the modules and mount configfs (modprobe nvmet nvmet-tcp; mount -t configfs none /sys/kernel/config)", ErrNoNvmet, cfg.Root, d)
		}
	}
	return &NvmetExporter{root: cfg.Root, addr: ip.String(), log: cfg.Logger}, nil
}

func (e *NvmetExporter) subsys(nqn string) string { return filepath.Join(e.root, "subsystems", nqn) }
func (e *NvmetExporter) port(id int) string       { return filepath.Join(e.root, "ports", strconv.Itoa(id)) }
func (e *NvmetExporter) ns(nqn string) string     { return filepath.Join(e.subsys(nqn), "namespaces", "1") }

// Reconcile makes configfs export exactly want among the simulator's own
// entries.
func (e *NvmetExporter) Reconcile(want []Export) error {
	wanted := map[string]Export{}
	// nvmet keeps one key per host: two exports allowing one host must
	// want the same, or one would clear or swap the other's.
	keyOf := map[string]Export{}
	for _, x := range want {
		if _, dup := wanted[x.NQN]; dup {
			return fmt.Errorf("two exported disks have NQN %s", x.NQN)
		}
		wanted[x.NQN] = x
		if x.AllowHost == "" {
			continue
		}
		if o, ok := keyOf[x.AllowHost]; ok && o.Secret != x.Secret {
			return fmt.Errorf("subsystems %s and %s allow host %s with different passwords: nvmet keeps one DH-HMAC-CHAP key per host", o.NQN, x.NQN, x.AllowHost)
		}
		keyOf[x.AllowHost] = x
	}
	ours, err := e.ownSubsystems()
	if err != nil {
		return err
	}
	var errs []error
	for _, nqn := range ours {
		if _, ok := wanted[nqn]; !ok {
			errs = append(errs, e.remove(nqn))
		}
	}
	for _, x := range want {
		errs = append(errs, e.apply(x))
	}
	errs = append(errs, e.removeIdlePorts())
	return errors.Join(errs...)
}

// ownSubsystems lists the NQNs of the subsystems the simulator made.
func (e *NvmetExporter) ownSubsystems() ([]string, error) {
	names, err := dirNames(filepath.Join(e.root, "subsystems"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if e.isOwn(n) {
			out = append(out, n)
		}
	}
	return out, nil
}

func (e *NvmetExporter) isOwn(nqn string) bool {
	m, err := readTrim(filepath.Join(e.subsys(nqn), "attr_model"))
	return err == nil && m == NvmetModel
}

// apply creates or updates one export.
func (e *NvmetExporter) apply(x Export) error {
	dir := e.subsys(x.NQN)
	created := false
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("creating subsystem %s: %w", x.NQN, err)
		}
		created = true
		if err := writeAttr(filepath.Join(dir, "attr_model"), NvmetModel); err != nil {
			return fmt.Errorf("marking subsystem %s: %w", x.NQN, err)
		}
		e.log.Info("nvmet subsystem created", "nqn", x.NQN)
	} else if err != nil {
		return err
	} else if !e.isOwn(x.NQN) {
		return fmt.Errorf("subsystem %s already exists in %s and is not the simulator's (attr_model is not %q); remove it or use another NQN", x.NQN, e.root, NvmetModel)
	}
	hostsChanged, err := e.applyHosts(x)
	if err != nil {
		return err
	}
	if err := e.applyNamespace(x, created); err != nil {
		return err
	}
	if hostsChanged && x.DropOnHostChange && !created {
		// nvmet checks the host at connect only; taking the subsystem off
		// its port and back drops every established connection, and the
		// hosts no longer allowed cannot reconnect (../shared/NVME-VM.md).
		if err := e.unlinkFromPorts(x.NQN); err != nil {
			return err
		}
		e.log.Info("nvmet connections dropped: the allowed host changed", "nqn", x.NQN, "host", x.AllowHost)
	}
	return e.applyPort(x)
}

// unlinkFromPorts takes a subsystem off every port it is linked to, which
// drops its established connections.
func (e *NvmetExporter) unlinkFromPorts(nqn string) error {
	ports, err := dirNames(filepath.Join(e.root, "ports"))
	if err != nil {
		return err
	}
	for _, p := range ports {
		link := filepath.Join(e.root, "ports", p, "subsystems", nqn)
		if _, err := os.Lstat(link); err != nil {
			continue
		}
		if err := os.Remove(link); err != nil {
			return fmt.Errorf("subsystem %s: unlinking from port %s: %w", nqn, p, err)
		}
		if e.onUnlink != nil {
			e.onUnlink(p, nqn)
		}
	}
	return nil
}

// applyHosts sets allowed_hosts: any host when AllowHost is empty,
// otherwise only AllowHost, and reports whether the set of hosts that may
// connect changed. nvmet refuses allow_any_host=1 while hosts are linked
// and a link while allow_any_host=1, hence the order. Controllers already
// connected are not dropped by the change itself (nvmet checks hosts at
// connect only); apply drops them when the Export asks for it.
func (e *NvmetExporter) applyHosts(x Export) (changed bool, err error) {
	dir := e.subsys(x.NQN)
	allowed := filepath.Join(dir, "allowed_hosts")
	linked, err := dirNames(allowed)
	if err != nil {
		return false, err
	}
	anyHost := filepath.Join(dir, "attr_allow_any_host")
	wasAny, _ := readTrim(anyHost)
	if x.AllowHost == "" {
		if x.Secret != "" {
			// nvmet authenticates hosts it has an entry for; any host
			// would connect unauthenticated. Refused rather than let a
			// password look like protection.
			return false, fmt.Errorf("subsystem %s: a password needs an allowed host (nvme-tcp-server-allow-host-name): with any host allowed nothing is authenticated", x.NQN)
		}
		for _, h := range linked {
			if err := os.Remove(filepath.Join(allowed, h)); err != nil {
				return true, fmt.Errorf("subsystem %s: unlinking host %s: %w", x.NQN, h, err)
			}
		}
		return wasAny != "1" || len(linked) > 0, writeAttrIfDiffers(anyHost, "1")
	}
	changed = wasAny != "0"
	if err := writeAttrIfDiffers(anyHost, "0"); err != nil {
		return changed, fmt.Errorf("subsystem %s: %w", x.NQN, err)
	}
	for _, h := range linked {
		if h != x.AllowHost {
			changed = true
			if err := os.Remove(filepath.Join(allowed, h)); err != nil {
				return changed, fmt.Errorf("subsystem %s: unlinking host %s: %w", x.NQN, h, err)
			}
		}
	}
	host := filepath.Join(e.root, "hosts", x.AllowHost)
	if containsString(linked, x.AllowHost) {
		// The key first changes at the host's next connect; established
		// connections stay (nvmet authenticates at connect).
		return changed, e.setHostKey(host, x)
	}
	if err := os.Mkdir(host, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return changed, fmt.Errorf("creating host %s: %w", x.AllowHost, err)
	}
	// The key before the link: the host is never allowed in without
	// the authentication it is meant to need.
	if err := e.setHostKey(host, x); err != nil {
		return changed, err
	}
	if err := os.MkdirAll(allowed, 0o755); err != nil {
		return changed, err
	}
	if err := os.Symlink(host, filepath.Join(allowed, x.AllowHost)); err != nil {
		return changed, fmt.Errorf("subsystem %s: allowing host %s: %w", x.NQN, x.AllowHost, err)
	}
	e.log.Info("nvmet host allowed", "nqn", x.NQN, "host", x.AllowHost)
	return true, nil
}

// setHostKey sets (or, for no secret, clears) the DH-HMAC-CHAP key the
// host must present. A kernel whose nvmet has no authentication
// (CONFIG_NVME_TARGET_AUTH) has no dhchap_key attribute: a wanted secret
// is then an error, never a silent export without authentication.
func (e *NvmetExporter) setHostKey(host string, x Export) error {
	attr := filepath.Join(host, "dhchap_key")
	if _, err := os.Stat(attr); errors.Is(err, fs.ErrNotExist) {
		if x.Secret == "" {
			return nil
		}
		return fmt.Errorf("subsystem %s: the kernel's nvmet has no in-band authentication (no %s; CONFIG_NVME_TARGET_AUTH): cannot require the password", x.NQN, attr)
	}
	if err := writeAttrIfDiffers(attr, x.Secret); err != nil {
		return fmt.Errorf("subsystem %s: setting the allowed host's key: %w", x.NQN, err)
	}
	return nil
}

// applyNamespace keeps namespace 1 enabled on x.File and tells nvmet
// about a size change.
func (e *NvmetExporter) applyNamespace(x Export, created bool) error {
	ns := e.ns(x.NQN)
	if err := os.MkdirAll(ns, 0o755); err != nil {
		return fmt.Errorf("subsystem %s: creating namespace: %w", x.NQN, err)
	}
	path, _ := readTrim(filepath.Join(ns, "device_path"))
	enabled, _ := readTrim(filepath.Join(ns, "enable"))
	if path == x.File && enabled == "1" {
		if created {
			return nil
		}
		// Cheap and idempotent: nvmet re-reads the file's size and, when it
		// changed, tells the hosts (a namespace-changed event).
		if err := writeAttr(filepath.Join(ns, "revalidate_size"), "1"); err != nil {
			return fmt.Errorf("subsystem %s: revalidating the namespace size: %w", x.NQN, err)
		}
		return nil
	}
	if enabled == "1" {
		if err := writeAttr(filepath.Join(ns, "enable"), "0"); err != nil {
			return fmt.Errorf("subsystem %s: disabling the namespace: %w", x.NQN, err)
		}
	}
	if err := writeAttr(filepath.Join(ns, "device_path"), x.File); err != nil {
		return fmt.Errorf("subsystem %s: namespace device_path: %w", x.NQN, err)
	}
	if err := writeAttr(filepath.Join(ns, "buffered_io"), "0"); err != nil {
		return fmt.Errorf("subsystem %s: namespace buffered_io: %w", x.NQN, err)
	}
	err := writeAttr(filepath.Join(ns, "enable"), "1")
	if errors.Is(err, syscall.EINVAL) {
		// nvmet opens the file with O_DIRECT, which tmpfs refuses.
		e.log.Info("backing file refuses O_DIRECT; exporting it with buffered I/O", "nqn", x.NQN, "file", x.File)
		if err = writeAttr(filepath.Join(ns, "buffered_io"), "1"); err == nil {
			err = writeAttr(filepath.Join(ns, "enable"), "1")
		}
	}
	if err != nil {
		return fmt.Errorf("subsystem %s: enabling the namespace on %s: %w", x.NQN, x.File, err)
	}
	return nil
}

// applyPort links the subsystem to exactly the port x.Port.
func (e *NvmetExporter) applyPort(x Export) error {
	if x.Port < 1 || x.Port > 65535 {
		return fmt.Errorf("subsystem %s: port %d", x.NQN, x.Port)
	}
	ports, err := dirNames(filepath.Join(e.root, "ports"))
	if err != nil {
		return err
	}
	for _, p := range ports {
		link := filepath.Join(e.root, "ports", p, "subsystems", x.NQN)
		if p == strconv.Itoa(x.Port) {
			continue
		}
		if _, err := os.Lstat(link); err == nil {
			if err := os.Remove(link); err != nil {
				return fmt.Errorf("subsystem %s: unlinking from port %s: %w", x.NQN, p, err)
			}
			if e.onUnlink != nil {
				e.onUnlink(p, x.NQN)
			}
		}
	}
	if err := e.ensurePort(x.Port); err != nil {
		return err
	}
	link := filepath.Join(e.port(x.Port), "subsystems", x.NQN)
	if _, err := os.Lstat(link); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return err
	}
	if err := os.Symlink(e.subsys(x.NQN), link); err != nil {
		return fmt.Errorf("subsystem %s: linking to port %d: %w", x.NQN, x.Port, err)
	}
	e.log.Info("nvmet subsystem exported", "nqn", x.NQN, "address", e.addr, "port", x.Port)
	return nil
}

func (e *NvmetExporter) ensurePort(port int) error {
	dir := e.port(port)
	if _, err := os.Stat(dir); err == nil {
		if !e.isOwnPort(port) {
			return fmt.Errorf("nvmet port %d exists and is not the simulator's (it does not listen on tcp %s:%d)", port, e.addr, port)
		}
		return nil
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("creating nvmet port %d: %w", port, err)
	}
	family := "ipv4"
	if net.ParseIP(e.addr).To4() == nil {
		family = "ipv6"
	}
	for _, a := range [][2]string{{"addr_trtype", "tcp"}, {"addr_adrfam", family}, {"addr_traddr", e.addr}, {"addr_trsvcid", strconv.Itoa(port)}} {
		if err := writeAttr(filepath.Join(dir, a[0]), a[1]); err != nil {
			return fmt.Errorf("nvmet port %d: %s: %w", port, a[0], err)
		}
	}
	return nil
}

func (e *NvmetExporter) isOwnPort(port int) bool {
	dir := e.port(port)
	typ, _ := readTrim(filepath.Join(dir, "addr_trtype"))
	addr, _ := readTrim(filepath.Join(dir, "addr_traddr"))
	svc, _ := readTrim(filepath.Join(dir, "addr_trsvcid"))
	return typ == "tcp" && addr == e.addr && svc == strconv.Itoa(port)
}

// removeIdlePorts removes the simulator's ports that no subsystem uses.
func (e *NvmetExporter) removeIdlePorts() error {
	ports, err := dirNames(filepath.Join(e.root, "ports"))
	if err != nil {
		return err
	}
	for _, p := range ports {
		id, err := strconv.Atoi(p)
		if err != nil || !e.isOwnPort(id) {
			continue
		}
		subs, err := dirNames(filepath.Join(e.port(id), "subsystems"))
		if err != nil || len(subs) > 0 {
			continue
		}
		if err := removeGroup(e.port(id)); err != nil {
			return fmt.Errorf("removing nvmet port %d: %w", id, err)
		}
	}
	return nil
}

// remove takes one of the simulator's subsystems down: off every port
// (which drops its connections: export off, disk removed), namespace
// disabled and removed, hosts unlinked, subsystem removed.
func (e *NvmetExporter) remove(nqn string) error {
	if err := e.unlinkFromPorts(nqn); err != nil {
		return err
	}
	nsDir := filepath.Join(e.subsys(nqn), "namespaces")
	nss, err := dirNames(nsDir)
	if err != nil {
		return err
	}
	for _, n := range nss {
		_ = writeAttr(filepath.Join(nsDir, n, "enable"), "0")
		if err := removeGroup(filepath.Join(nsDir, n)); err != nil {
			return fmt.Errorf("subsystem %s: removing namespace %s: %w", nqn, n, err)
		}
	}
	allowed := filepath.Join(e.subsys(nqn), "allowed_hosts")
	hosts, err := dirNames(allowed)
	if err != nil {
		return err
	}
	for _, h := range hosts {
		if err := os.Remove(filepath.Join(allowed, h)); err != nil {
			return fmt.Errorf("subsystem %s: unlinking host %s: %w", nqn, h, err)
		}
	}
	if err := removeGroup(e.subsys(nqn)); err != nil {
		return fmt.Errorf("removing subsystem %s: %w", nqn, err)
	}
	e.log.Info("nvmet subsystem removed", "nqn", nqn)
	return nil
}

// removeGroup removes a configfs group with one rmdir: its attributes and
// default groups (allowed_hosts/, namespaces/, ana_groups/1) go with it and
// cannot be removed one by one. In a plain directory tree, as in tests,
// rmdir finds them and they are removed first.
func removeGroup(dir string) error {
	err := os.Remove(dir)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		return err
	}
	entries, rerr := os.ReadDir(dir)
	if rerr != nil {
		return err
	}
	for _, en := range entries {
		p := filepath.Join(dir, en.Name())
		if en.IsDir() {
			if err := removeGroup(p); err != nil {
				return err
			}
			continue
		}
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	return os.Remove(dir)
}

func dirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(entries))
	for _, en := range entries {
		out = append(out, en.Name())
	}
	return out, nil
}

func readTrim(p string) (string, error) {
	b, err := os.ReadFile(p)
	return strings.TrimSpace(string(b)), err
}

// writeAttr writes one configfs attribute (created if missing, for plain
// directories in tests).
func writeAttr(p, v string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write([]byte(v + "\n"))
	cerr := f.Close()
	if werr != nil {
		return werr
	}
	return cerr
}

func writeAttrIfDiffers(p, v string) error {
	if got, err := readTrim(p); err == nil && got == v {
		return nil
	}
	return writeAttr(p, v)
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
