package nvme

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeHost is a node's NVMe view on disk: a sysfs tree laid out like the
// kernel's (class directories, controller links inside the subsystem
// directory), a /dev with plain files for device nodes, /etc/nvme, and a
// plain file standing in for /dev/nvme-fabrics.
type fakeHost struct {
	t                      *testing.T
	sys, dev, etc, fabrics string
}

const (
	testPrefix  = "nqn.2000-02.com.mikrotik:pvc-"
	testHostNQN = "nqn.2014-08.org.nvmexpress:uuid:0f8c2a4e-5b1d-4e7a-9c3f-1a2b3c4d5e6f"
	testHostID  = "0f8c2a4e-5b1d-4e7a-9c3f-1a2b3c4d5e6f"
)

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	root := t.TempDir()
	h := &fakeHost{
		t:       t,
		sys:     filepath.Join(root, "sys"),
		dev:     filepath.Join(root, "dev"),
		etc:     filepath.Join(root, "etc", "nvme"),
		fabrics: filepath.Join(root, "dev", "nvme-fabrics"),
	}
	h.mkdir(filepath.Join(h.sys, "class", "nvme-subsystem"))
	h.mkdir(filepath.Join(h.sys, "class", "nvme"))
	h.write(h.fabrics, "")
	h.write(filepath.Join(h.etc, "hostnqn"), testHostNQN+"\n")
	h.write(filepath.Join(h.etc, "hostid"), testHostID+"\n")
	return h
}

func (h *fakeHost) config() Config {
	return Config{
		NQNPrefix:   testPrefix,
		SysRoot:     h.sys,
		DevRoot:     h.dev,
		EtcNVMeDir:  h.etc,
		FabricsPath: h.fabrics,
		Runner: RunnerFunc(func(_ context.Context, name string, args ...string) ([]byte, error) {
			h.t.Errorf("unexpected command: %s %v", name, args)
			return nil, errors.New("no commands on the fake host")
		}),
	}
}

func (h *fakeHost) connector() *TCPConnector {
	h.t.Helper()
	c, err := NewTCPConnector(h.config())
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

func (h *fakeHost) subsysDir(sub string) string {
	return filepath.Join(h.sys, "class", "nvme-subsystem", sub)
}

func (h *fakeHost) ctrlDir(ctrl string) string { return filepath.Join(h.sys, "class", "nvme", ctrl) }

// subsystem creates nvme-subsysN with its NQN.
func (h *fakeHost) subsystem(sub, nqn string) {
	h.write(filepath.Join(h.subsysDir(sub), "subsysnqn"), nqn+"\n")
	h.write(filepath.Join(h.subsysDir(sub), "model"), "RDS\n")
}

// controller creates class/nvme/<ctrl>, connected as the node's own host
// NQN, and links it from the subsystem (if sub is not empty), as the
// kernel does.
func (h *fakeHost) controller(sub, ctrl, nqn, state string) {
	h.controllerAs(sub, ctrl, nqn, testHostNQN, state)
}

// controllerAs is controller connected as hostNQN.
func (h *fakeHost) controllerAs(sub, ctrl, nqn, hostNQN, state string) {
	d := h.ctrlDir(ctrl)
	h.write(filepath.Join(d, "subsysnqn"), nqn+"\n")
	h.write(filepath.Join(d, "hostnqn"), hostNQN+"\n")
	h.write(filepath.Join(d, "state"), state+"\n")
	h.write(filepath.Join(d, "transport"), "tcp\n")
	h.write(filepath.Join(d, "delete_controller"), "")
	h.write(filepath.Join(d, "rescan_controller"), "")
	if sub != "" {
		if err := os.Symlink(filepath.Join("..", "..", "nvme", ctrl), filepath.Join(h.subsysDir(sub), ctrl)); err != nil {
			h.t.Fatal(err)
		}
	}
}

// head creates a native multipath head namespace and its device node.
func (h *fakeHost) head(sub, ns string) {
	h.write(filepath.Join(h.subsysDir(sub), ns, "size"), "2048\n")
	h.write(filepath.Join(h.dev, ns), "")
}

// path creates a per-path namespace under a controller (hidden: no node).
func (h *fakeHost) path(ctrl, ns string) {
	h.write(filepath.Join(h.ctrlDir(ctrl), ns, "size"), "2048\n")
}

// private creates a namespace of a controller without multipath.
func (h *fakeHost) private(ctrl, ns string) {
	h.path(ctrl, ns)
	h.write(filepath.Join(h.dev, ns), "")
}

func (h *fakeHost) devNode(name string) { h.write(filepath.Join(h.dev, name), "") }

func (h *fakeHost) remove(paths ...string) {
	for _, p := range paths {
		if err := os.RemoveAll(p); err != nil {
			h.t.Fatal(err)
		}
	}
}

func (h *fakeHost) read(path string) string {
	h.t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

func (h *fakeHost) fabricsWritten() string { return h.read(h.fabrics) }

func (h *fakeHost) ctrlAttr(ctrl, attr string) string {
	return h.read(filepath.Join(h.ctrlDir(ctrl), attr))
}

func (h *fakeHost) mkdir(dir string) {
	h.t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Fatal(err)
	}
}

func (h *fakeHost) write(path, content string) {
	h.t.Helper()
	h.mkdir(filepath.Dir(path))
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// reapDeleted plays the kernel's part in deleting controllers until the
// test ends: a controller whose delete_controller was written, or whose
// state is already "deleting", leaves sysfs with its namespaces' device
// nodes, and a subsystem with no controller left goes with its heads. It
// returns what delete_controller held when each controller was reaped.
func (h *fakeHost) reapDeleted() func() map[string]string {
	var (
		mu     sync.Mutex
		reaped = map[string]string{}
		stop   = make(chan struct{})
		done   = make(chan struct{})
	)
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			ctrls, _ := os.ReadDir(filepath.Join(h.sys, "class", "nvme"))
			for _, e := range ctrls {
				d := h.ctrlDir(e.Name())
				del, _ := os.ReadFile(filepath.Join(d, "delete_controller"))
				state, _ := os.ReadFile(filepath.Join(d, "state"))
				if string(del) != "1" && !strings.HasPrefix(string(state), stateDeleting) {
					continue
				}
				// Recorded first: whoever sees it gone finds it here.
				mu.Lock()
				reaped[e.Name()] = string(del)
				mu.Unlock()
				h.removeController(e.Name())
			}
		}
	}()
	h.t.Cleanup(func() { close(stop); <-done })
	return func() map[string]string {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(reaped)
	}
}

// removeController is the end of a controller's deletion, in the kernel's
// order: its namespaces' device nodes, its link in its subsystem and the
// subsystem with its heads when no controller is left in it, and only
// then the controller's own directory. It reports failures with Errorf:
// it runs outside the test's goroutine.
func (h *fakeHost) removeController(ctrl string) {
	rm := func(p string) {
		if err := os.RemoveAll(p); err != nil {
			h.t.Errorf("removing %s: %v", p, err)
		}
	}
	entries, _ := os.ReadDir(h.ctrlDir(ctrl))
	for _, e := range entries {
		if namespaceName.MatchString(e.Name()) {
			rm(filepath.Join(h.dev, e.Name()))
		}
	}
	subs, _ := os.ReadDir(filepath.Join(h.sys, "class", "nvme-subsystem"))
	for _, sub := range subs {
		dir := h.subsysDir(sub.Name())
		if _, err := os.Lstat(filepath.Join(dir, ctrl)); err != nil {
			continue // not this controller's subsystem
		}
		rm(filepath.Join(dir, ctrl))
		entries, _ := os.ReadDir(dir)
		left := false
		for _, e := range entries {
			left = left || controllerName.MatchString(e.Name())
		}
		if left {
			continue
		}
		for _, e := range entries {
			if namespaceName.MatchString(e.Name()) {
				rm(filepath.Join(h.dev, e.Name()))
			}
		}
		rm(dir)
	}
	// The directory goes at once, as sysfs shows it: the test then never
	// sees a controller half gone (the connector copes with that anyway).
	trash, err := os.MkdirTemp(filepath.Dir(h.sys), "deleted-")
	if err != nil {
		h.t.Errorf("removing %s: %v", ctrl, err)
		return
	}
	if err := os.Rename(h.ctrlDir(ctrl), filepath.Join(trash, ctrl)); err != nil {
		h.t.Errorf("removing %s: %v", ctrl, err)
	}
	rm(trash)
}

// connectingKernel plays the kernel's part in a connect: it makes
// controller ctrl in subsystem sub, connected as the options' hostnqn,
// with a multipath head ns, and records the options it saw.
func (h *fakeHost) connectingKernel(sub, ctrl, ns string, saw *[]string) func(string) error {
	return func(opts string) error {
		*saw = append(*saw, opts)
		h.subsystem(sub, optionValue(opts, "nqn"))
		h.controllerAs(sub, ctrl, optionValue(opts, "nqn"), optionValue(opts, "hostnqn"), "live")
		// Like Linux (drivers/nvme/host/sysfs.c, S_IRUGO | S_IWUSR):
		// the controller's secret, readable by every user.
		secret := optionValue(opts, "dhchap_secret")
		if secret == "" {
			secret = "none"
		}
		h.write(filepath.Join(h.ctrlDir(ctrl), "dhchap_secret"), secret+"\n")
		h.write(filepath.Join(h.ctrlDir(ctrl), "dhchap_ctrl_secret"), "none\n")
		h.head(sub, ns)
		return nil
	}
}

// optionValue is key's value in a fabrics option string.
func optionValue(opts, key string) string {
	for _, kv := range strings.Split(opts, ",") {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}
