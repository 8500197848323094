package nvme

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// The kernel's names, which this package matches by pattern only:
//
//	/sys/class/nvme-subsystem/nvme-subsysS/subsysnqn
//	/sys/class/nvme-subsystem/nvme-subsysS/nvmeX        -> the controller (symlink)
//	/sys/class/nvme-subsystem/nvme-subsysS/nvmeSnN      native multipath head (/dev/nvmeSnN)
//	/sys/class/nvme/nvmeX/{subsysnqn,state,hostnqn,delete_controller,rescan_controller}
//	/sys/class/nvme/nvmeX/nvmeScXnN                     one path of a multipath head (hidden, no /dev node)
//	/sys/class/nvme/nvmeX/nvmeXnN                       namespace without multipath (/dev/nvmeXnN)
var (
	controllerName = regexp.MustCompile(`^nvme[0-9]+$`)
	namespaceName  = regexp.MustCompile(`^nvme[0-9]+n([0-9]+)$`)
	pathName       = regexp.MustCompile(`^nvme[0-9]+c[0-9]+n([0-9]+)$`)
)

// Controller states (/sys/class/nvme/nvmeX/state).
const (
	stateLive     = "live"
	stateDeleting = "deleting"
)

// sysfs reads the NVMe parts of a sysfs tree rooted at root (normally /sys).
type sysfs struct{ root string }

type controller struct {
	name  string // nvmeX
	state string // live, connecting, resetting, deleting, ...
}

// namespace ranks: lower is preferred.
const (
	rankBlock = iota // a multipath head or a namespace without multipath
	rankPath         // one path of a multipath head
)

type namespace struct {
	name string
	nsid int
	rank int
}

// nqnState is everything sysfs says about one subsystem NQN, read at once.
type nqnState struct {
	subsystems  []string
	controllers []controller
	namespaces  []namespace // sorted: preferred first
}

func (s nqnState) connected() bool { return len(s.subsystems) > 0 || len(s.controllers) > 0 }

func (s nqnState) live() bool {
	for _, c := range s.controllers {
		if c.state == stateLive {
			return true
		}
	}
	return false
}

func (s sysfs) subsystemDir() string          { return filepath.Join(s.root, "class", "nvme-subsystem") }
func (s sysfs) controllerDir(c string) string { return filepath.Join(s.root, "class", "nvme", c) }

// lookup resolves nqn from scratch. A missing class directory means the NVMe
// core is not loaded, so nothing is connected: not an error.
func (s sysfs) lookup(nqn string) (nqnState, error) {
	var st nqnState
	ctrls := map[string]bool{}
	nss := map[string]namespace{}

	subsystems, err := readDirNames(s.subsystemDir())
	if err != nil {
		return st, err
	}
	for _, sub := range subsystems {
		dir := filepath.Join(s.subsystemDir(), sub)
		got, err := readAttr(filepath.Join(dir, "subsysnqn"))
		if err != nil || got != nqn {
			// A subsystem vanishing mid-scan is someone else's business.
			continue
		}
		st.subsystems = append(st.subsystems, sub)
		entries, err := readDirNames(dir)
		if err != nil {
			return st, err
		}
		for _, e := range entries {
			switch {
			case controllerName.MatchString(e):
				ctrls[e] = true
			case namespaceName.MatchString(e):
				nss[e] = newNamespace(e, namespaceName, rankBlock)
			}
		}
	}

	// Controllers also say which subsystem they belong to; this catches a
	// controller whose link in the subsystem directory is not there.
	all, err := readDirNames(filepath.Join(s.root, "class", "nvme"))
	if err != nil {
		return st, err
	}
	for _, c := range all {
		if !controllerName.MatchString(c) || ctrls[c] {
			continue
		}
		if got, err := readAttr(filepath.Join(s.controllerDir(c), "subsysnqn")); err == nil && got == nqn {
			ctrls[c] = true
		}
	}

	for c := range ctrls {
		state, err := readAttr(filepath.Join(s.controllerDir(c), "state"))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted while we looked
		}
		if err != nil {
			return st, err
		}
		st.controllers = append(st.controllers, controller{name: c, state: state})
		entries, err := readDirNames(s.controllerDir(c))
		if err != nil {
			return st, err
		}
		for _, e := range entries {
			switch {
			case namespaceName.MatchString(e):
				nss[e] = newNamespace(e, namespaceName, rankBlock)
			case pathName.MatchString(e):
				nss[e] = newNamespace(e, pathName, rankPath)
			}
		}
	}
	sort.Slice(st.controllers, func(i, j int) bool { return st.controllers[i].name < st.controllers[j].name })
	for _, n := range nss {
		st.namespaces = append(st.namespaces, n)
	}
	sort.Slice(st.namespaces, func(i, j int) bool {
		a, b := st.namespaces[i], st.namespaces[j]
		if a.rank != b.rank {
			return a.rank < b.rank
		}
		if a.nsid != b.nsid {
			return a.nsid < b.nsid
		}
		return a.name < b.name
	})
	return st, nil
}

// controllerNQN re-reads one controller's subsystem NQN right before acting
// on it, so that a renumbering between scan and write cannot redirect the
// action to another subsystem's controller.
func (s sysfs) controllerNQN(c string) (string, error) {
	return readAttr(filepath.Join(s.controllerDir(c), "subsysnqn"))
}

// errNoHostNQN: a controller shows no hostnqn attribute, although it is
// there. The kernel removes a controller's attributes one by one when it
// deletes it, so this is usually a moment in a deletion.
var errNoHostNQN = errors.New("shows no hostnqn in sysfs")

// controllerHostNQN reads the host NQN a controller connected with (the
// kernel shows it for every fabrics controller). ok is false when the
// controller has gone meanwhile; errNoHostNQN when it is there without
// the attribute.
func (s sysfs) controllerHostNQN(c string) (nqn string, ok bool, err error) {
	nqn, err = readAttr(filepath.Join(s.controllerDir(c), "hostnqn"))
	if err == nil {
		return nqn, true, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", false, err
	}
	if _, serr := os.Stat(filepath.Join(s.controllerDir(c), "state")); errors.Is(serr, fs.ErrNotExist) {
		return "", false, nil
	}
	return "", false, fmt.Errorf("controller %s %w", c, errNoHostNQN)
}

// restrictSecrets makes a controller's DH-HMAC-CHAP secret attributes
// readable by root only (the kernel creates them 0644). A kernel without
// NVMe host authentication has none: nothing to do.
func (s sysfs) restrictSecrets(c string) error {
	for _, attr := range []string{"dhchap_secret", "dhchap_ctrl_secret"} {
		if err := os.Chmod(filepath.Join(s.controllerDir(c), attr), 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// writeControllerAttr writes "1" to a controller attribute such as
// delete_controller. It never creates files.
func (s sysfs) writeControllerAttr(c, attr string) error {
	path := filepath.Join(s.controllerDir(c), attr)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, werr := f.Write([]byte("1"))
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("writing %s: %w", path, werr)
	}
	if cerr != nil {
		return fmt.Errorf("writing %s: %w", path, cerr)
	}
	return nil
}

func newNamespace(name string, re *regexp.Regexp, rank int) namespace {
	nsid, _ := strconv.Atoi(re.FindStringSubmatch(name)[1])
	return namespace{name: name, nsid: nsid, rank: rank}
}

func readDirNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

func readAttr(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", attrErr(err)
	}
	return strings.TrimSpace(string(b)), nil
}

// attrErr: a sysfs attribute of a device the kernel is tearing down
// answers ENODEV, not ENOENT, for a moment before its directory goes (seen
// in the VM tier: "read /sys/class/nvme/nvme0/state: no such device" while
// a controller was being deleted). It is as gone as a missing one.
func attrErr(err error) error {
	if errors.Is(err, syscall.ENODEV) {
		return fmt.Errorf("%w (%w)", fs.ErrNotExist, err)
	}
	return err
}
