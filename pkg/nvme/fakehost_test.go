package nvme

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
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

// controller creates class/nvme/<ctrl> and links it from the subsystem (if
// sub is not empty), as the kernel does.
func (h *fakeHost) controller(sub, ctrl, nqn, state string) {
	d := h.ctrlDir(ctrl)
	h.write(filepath.Join(d, "subsysnqn"), nqn+"\n")
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
