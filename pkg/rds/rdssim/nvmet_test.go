package rdssim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The nvmet backend's logic against a plain directory standing in for
// /sys/kernel/config/nvmet; the same code runs on the real configfs in the
// NVMe/TCP VM tier (e2e/nvme).

func fakeNvmetRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "nvmet")
	for _, d := range []string{"subsystems", "ports", "hosts"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func startNvmetSim(t *testing.T, root string) *testSim {
	t.Helper()
	return startSim(t, func(c *Config) {
		e, err := NewNvmetExporter(NvmetConfig{Root: root})
		if err != nil {
			t.Fatal(err)
		}
		c.Exporter = e
	})
}

func readAttrT(t *testing.T, p string) string {
	t.Helper()
	v, err := readTrim(p)
	if err != nil {
		t.Fatalf("reading %s: %v", p, err)
	}
	return v
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func TestNvmetExportLifecycle(t *testing.T) {
	root := fakeNvmetRoot(t)
	ts := startNvmetSim(t, root)
	const nqn = "nqn.2000-02.com.mikrotik:d1"
	sub := filepath.Join(root, "subsystems", nqn)
	ns := filepath.Join(sub, "namespaces", "1")

	ts.mustRun(addCmd("d1", "1G"))
	if got := readAttrT(t, filepath.Join(sub, "attr_model")); got != NvmetModel {
		t.Errorf("attr_model = %q", got)
	}
	if got, want := readAttrT(t, filepath.Join(ns, "device_path")), ts.hostFile("k8s/d1.img"); got != want {
		t.Errorf("device_path = %q, want %q", got, want)
	}
	if readAttrT(t, filepath.Join(ns, "enable")) != "1" || readAttrT(t, filepath.Join(sub, "attr_allow_any_host")) != "1" {
		t.Error("namespace not enabled or hosts restricted without an allow-host name")
	}
	port := filepath.Join(root, "ports", "4420")
	for attr, want := range map[string]string{"addr_trtype": "tcp", "addr_traddr": "127.0.0.1", "addr_trsvcid": "4420", "addr_adrfam": "ipv4"} {
		if got := readAttrT(t, filepath.Join(port, attr)); got != want {
			t.Errorf("port %s = %q, want %q", attr, got, want)
		}
	}
	if target, err := os.Readlink(filepath.Join(port, "subsystems", nqn)); err != nil || target != sub {
		t.Errorf("port link = %q, %v", target, err)
	}

	// Allowed host: restricted, then another host, then any host again.
	for _, host := range []string{"nqn.2014-08.org.nvmexpress:uuid:a", "nqn.2014-08.org.nvmexpress:uuid:b"} {
		ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="` + host + `"`)
		if got := readAttrT(t, filepath.Join(sub, "attr_allow_any_host")); got != "0" {
			t.Errorf("allow_any_host = %q with host %s", got, host)
		}
		got, _ := dirNames(filepath.Join(sub, "allowed_hosts"))
		if len(got) != 1 || got[0] != host {
			t.Errorf("allowed_hosts = %v, want [%s]", got, host)
		}
	}
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name=""`)
	if got, _ := dirNames(filepath.Join(sub, "allowed_hosts")); len(got) != 0 || readAttrT(t, filepath.Join(sub, "attr_allow_any_host")) != "1" {
		t.Errorf("allowed_hosts = %v after clearing the host name", got)
	}

	// Growing the file revalidates the namespace.
	os.Remove(filepath.Join(ns, "revalidate_size"))
	ts.mustRun(`/disk set [find slot="d1"] file-size=2G`)
	if got, _ := readTrim(filepath.Join(ns, "revalidate_size")); got != "1" {
		t.Errorf("revalidate_size = %q after a grow, want 1", got)
	}
	// A print changes nothing and writes nothing.
	os.Remove(filepath.Join(ns, "revalidate_size"))
	ts.run(`/disk print detail`)
	if exists(filepath.Join(ns, "revalidate_size")) {
		t.Error("a print revalidated the namespace")
	}

	// Another port: the link moves, the idle port goes.
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-port=4421`)
	if exists(port) || !exists(filepath.Join(root, "ports", "4421", "subsystems", nqn)) {
		t.Errorf("after the port change: %v", listFiles(t, filepath.Join(root, "ports")))
	}

	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-export=no`)
	if exists(sub) || exists(filepath.Join(root, "ports", "4421")) {
		t.Errorf("export off left %v", listFiles(t, root))
	}
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-export=yes`)
	if !exists(ns) {
		t.Fatal("export on again did not recreate the subsystem")
	}
	ts.mustRun(`/disk remove [find slot="d1"]`)
	if exists(sub) {
		t.Error("disk remove left the subsystem")
	}
}

// At start-up the simulator makes configfs match its disks, removes its
// own stale entries and leaves everybody else's alone.
func TestNvmetReconcileAtStart(t *testing.T) {
	root := fakeNvmetRoot(t)
	ts := startNvmetSim(t, root)
	ts.mustRun(addCmd("d1", "1G"))
	ts.mustRun(addCmd("d2", "1G"))
	ts.stop()

	// Meanwhile: d2 is gone from configfs (a reboot), a stale export of
	// ours and a foreign subsystem and port appeared.
	d2 := filepath.Join(root, "subsystems", "nqn.2000-02.com.mikrotik:d2")
	if err := removeGroup(d2); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(root, "ports", "4420", "subsystems", "nqn.2000-02.com.mikrotik:d2"))
	stale := filepath.Join(root, "subsystems", "nqn.2000-02.com.mikrotik:stale")
	foreign := filepath.Join(root, "subsystems", "nqn.2014-08.org.example:other")
	for dir, model := range map[string]string{stale: NvmetModel, foreign: "Linux"} {
		if err := os.MkdirAll(filepath.Join(dir, "namespaces", "1"), 0o755); err != nil {
			t.Fatal(err)
		}
		writeAttr(filepath.Join(dir, "attr_model"), model)
	}
	foreignPort := filepath.Join(root, "ports", "1")
	os.MkdirAll(filepath.Join(foreignPort, "subsystems"), 0o755)
	writeAttr(filepath.Join(foreignPort, "addr_trsvcid"), "4420")
	writeAttr(filepath.Join(foreignPort, "addr_traddr"), "10.0.0.1")
	if err := os.Symlink(foreign, filepath.Join(foreignPort, "subsystems", filepath.Base(foreign))); err != nil {
		t.Fatal(err)
	}

	ts.start()
	if !exists(filepath.Join(d2, "namespaces", "1", "device_path")) || !exists(filepath.Join(root, "ports", "4420", "subsystems", filepath.Base(d2))) {
		t.Error("restart did not export d2 again")
	}
	if exists(stale) {
		t.Error("the simulator's stale subsystem survived the restart")
	}
	if !exists(filepath.Join(foreign, "namespaces", "1")) || !exists(filepath.Join(foreignPort, "subsystems", filepath.Base(foreign))) {
		t.Errorf("a foreign entry was touched: %v", listFiles(t, root))
	}
}

// A subsystem someone else made under a wanted NQN is not taken over: the
// command is refused and the subsystem left as it was.
func TestNvmetForeignSubsystemWithWantedNQN(t *testing.T) {
	root := fakeNvmetRoot(t)
	foreign := filepath.Join(root, "subsystems", "nqn.2000-02.com.mikrotik:d1")
	os.MkdirAll(foreign, 0o755)
	writeAttr(filepath.Join(foreign, "attr_model"), "Linux")
	ts := startNvmetSim(t, root)
	out := ts.run(addCmd("d1", "1G"))
	if !strings.Contains(out, "not the simulator's") {
		t.Errorf("output %q, want a refusal naming the foreign subsystem", out)
	}
	if exists(filepath.Join(foreign, "namespaces")) || readAttrT(t, filepath.Join(foreign, "attr_model")) != "Linux" {
		t.Errorf("the foreign subsystem was changed: %v", listFiles(t, foreign))
	}
}

func TestNewNvmetExporterWithoutConfigfs(t *testing.T) {
	_, err := NewNvmetExporter(NvmetConfig{Root: filepath.Join(t.TempDir(), "nope")})
	if !errors.Is(err, ErrNoNvmet) || !strings.Contains(err.Error(), "modprobe nvmet") {
		t.Errorf("err = %v, want ErrNoNvmet naming the fix", err)
	}
	if _, err := NewNvmetExporter(NvmetConfig{Root: fakeNvmetRoot(t), Address: "localhost"}); err == nil {
		t.Error("a host name was accepted as the listen address")
	}
}
