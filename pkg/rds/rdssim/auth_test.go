package rdssim

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

var secretInPrint = regexp.MustCompile(`nvme-tcp-server-secret="?([^" ]*)"?`)

// printed is d1's detail print with the terminal's wrapping undone.
func printed(ts *testSim) string {
	return regexp.MustCompile(`\n +`).ReplaceAllString(ts.run(`/disk print detail where slot="d1"`), "")
}

// A password turns into a read-only DHHC-1 secret in print; the password
// itself is never printed; "" takes it away. (Assumed RouterOS behaviour,
// docs/routeros.md.)
func TestPasswordPrintsASecretNeverThePassword(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("d1", "1G"))
	const password = "correct-horse-battery"
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="nqn.2014-08.org.nvmexpress:uuid:a" nvme-tcp-server-password="` + password + `"`)
	out := printed(ts)
	if strings.Contains(out, password) {
		t.Fatalf("print shows the password:\n%s", out)
	}
	m := secretInPrint.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no nvme-tcp-server-secret in:\n%s", out)
	}
	s, err := nvme.ParseDHCHAPSecret(m[1])
	if err != nil {
		t.Fatalf("the printed secret is not one a kernel takes: %v", err)
	}
	// The same password, the same secret; another, another.
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-password="` + password + `"`)
	if m2 := secretInPrint.FindStringSubmatch(printed(ts)); m2 == nil || m2[1] != s.Reveal() {
		t.Fatalf("the secret changed without a new password: %v", m2)
	}
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-password="another"`)
	if m3 := secretInPrint.FindStringSubmatch(printed(ts)); m3 == nil || m3[1] == s.Reveal() {
		t.Fatalf("a new password kept the secret: %v", m3)
	}
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-password=""`)
	if m4 := secretInPrint.FindStringSubmatch(printed(ts)); m4 != nil && m4[1] != "" {
		t.Fatalf("no password, yet a secret: %v", m4)
	}
}

// The nvmet backend gives the allowed host the secret as its DH-HMAC-CHAP
// key, before it links the host; a kernel without target authentication,
// or a password with any host allowed, is refused, never an export that
// only looks protected.
func TestNvmetHostKeyFollowsThePassword(t *testing.T) {
	ts, root, hostDir := nvmetDiskWithPassword(t, authHost, "pw-1")
	const host = authHost
	want := serverSecret("pw-1")
	if got := readAttrT(t, filepath.Join(hostDir, "dhchap_key")); got != want {
		t.Fatalf("dhchap_key = %q, want the printed secret", got)
	}
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-password="pw-2"`)
	if got := readAttrT(t, filepath.Join(hostDir, "dhchap_key")); got != serverSecret("pw-2") {
		t.Fatalf("dhchap_key = %q after a new password", got)
	}
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-password=""`)
	if got := readAttrT(t, filepath.Join(hostDir, "dhchap_key")); got != "" {
		t.Fatalf("dhchap_key = %q with no password", got)
	}

	// A host whose directory has no dhchap_key: nvmet without
	// authentication.
	const bare = "nqn.2014-08.org.nvmexpress:uuid:b"
	if out, _ := ts.tryRun(`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="` + bare + `" nvme-tcp-server-password="pw-3"`); !strings.Contains(out, "failure:") || !strings.Contains(out, "CONFIG_NVME_TARGET_AUTH") {
		t.Fatalf("a password was accepted by an nvmet without authentication: %q", out)
	}
	if linked, _ := dirNames(filepath.Join(root, "subsystems", "nqn.2000-02.com.mikrotik:d1", "allowed_hosts")); containsString(linked, bare) {
		t.Fatal("the host was let in without the key it needs")
	}
	// Any host with a password.
	if out, _ := ts.tryRun(`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="" nvme-tcp-server-password="pw-4"`); !strings.Contains(out, "needs an allowed host") {
		t.Fatalf("a password with any host allowed was accepted: %q", out)
	}
}

// The password is a property of the disk like its allowed host: kept
// across a restart and, under CopyFromInherit, taken by a copy together
// with the allowed host. A copy that took the allowed host and not the
// password would let that host in unauthenticated. (Assumed, as copy-from
// itself, docs/routeros.md.)
func TestPasswordPersistsAndGoesWithInheritedCopies(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.CopyFromProperties = CopyFromInherit })
	ts.mustRun(addCmd("d1", "4M"))
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="nqn.2014-08.org.nvmexpress:uuid:a" nvme-tcp-server-password="pw-1"`)
	before := secretInPrint.FindStringSubmatch(printed(ts))
	if before == nil || before[1] == "" {
		t.Fatal("no secret printed for a password")
	}
	ts.restart()
	if after := secretInPrint.FindStringSubmatch(printed(ts)); after == nil || after[1] != before[1] {
		t.Fatalf("after a restart the secret is %v, want the one before", after)
	}
	ts.mustRun(`/disk add type=file file-path="/storage-pool/k8s/d2.img" slot="d2" copy-from=[find slot="d1"]`)
	var copied *DiskInfo
	for _, d := range ts.srv.Disks() {
		if d.Slot == "d2" {
			copied = &d
		}
	}
	if copied == nil || copied.AllowHostName != "nqn.2014-08.org.nvmexpress:uuid:a" {
		t.Fatalf("the copy did not inherit the allowed host: %+v", copied)
	}
	out := regexp.MustCompile(`\n +`).ReplaceAllString(ts.run(`/disk print detail where slot="d2"`), "")
	if m := secretInPrint.FindStringSubmatch(out); m == nil || m[1] != before[1] {
		t.Fatalf("a copy inherited the allowed host but not the password (secret %v):\n%s", m, out)
	}
}

// A password the nvmet backend refuses (any host allowed; a host without
// a dhchap_key) fails the command and changes nothing, as a RouterOS
// failure does: the disk keeps its export, key and allowed host, and the
// commands after it still work.
func TestRefusedPasswordChangesNothing(t *testing.T) {
	ts, _, hostDir := nvmetDiskWithPassword(t, authHost, "pw-1")
	const host, bare = authHost, "nqn.2014-08.org.nvmexpress:uuid:b"
	want := printed(ts)
	for _, refused := range []string{
		`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="" nvme-tcp-server-password="pw-2"`,
		`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="` + bare + `" nvme-tcp-server-password="pw-3"`,
		`/disk add type=file file-path="/storage-pool/k8s/d3.img" slot="d3" file-size=1G nvme-tcp-export=yes nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:d3" nvme-tcp-server-password="pw-4"`,
	} {
		if out, _ := ts.tryRun(refused); !strings.Contains(out, "failure:") {
			t.Fatalf("%s: accepted: %q", refused, out)
		}
		if got := printed(ts); got != want {
			t.Fatalf("%s: a refused command changed d1:\n%s\nwas:\n%s", refused, got, want)
		}
		if got := readAttrT(t, filepath.Join(hostDir, "dhchap_key")); got != serverSecret("pw-1") {
			t.Fatalf("%s: the allowed host's key is %q", refused, got)
		}
	}
	for _, d := range ts.srv.Disks() {
		if d.Slot == "d3" {
			t.Fatalf("a refused add left its disk: %+v", d)
		}
	}
	ts.mustRun(addCmd("d2", "1G"))
	ts.restart()
	ts.mustRun(addCmd("d4", "1G"))
}

// nvmet keeps one DH-HMAC-CHAP key per host, RouterOS (as assumed) one
// password per disk. Two exports that allow one host with different keys
// cannot both be had: the second is refused, never let to clear or swap
// the key the first one's host must present.
func TestOneHostCannotHaveTwoKeys(t *testing.T) {
	ts, _, hostDir := nvmetDiskWithPassword(t, authHost, "pw-1")
	const host = authHost
	ts.mustRun(addCmd("d2", "1G"))
	for _, pw := range []string{"", "pw-2"} {
		out, _ := ts.tryRun(`/disk set [find slot="d2"] nvme-tcp-server-allow-host-name="` + host + `" nvme-tcp-server-password="` + pw + `"`)
		if got := readAttrT(t, filepath.Join(hostDir, "dhchap_key")); got != serverSecret("pw-1") {
			t.Fatalf("password %q on a second disk of the host (%q): the host's key is now %q, not d1's", pw, out, got)
		}
		if !strings.Contains(out, "failure:") {
			t.Fatalf("password %q on a second disk of the host: accepted", pw)
		}
	}
	// The same password on both is one key: allowed.
	ts.mustRun(`/disk set [find slot="d2"] nvme-tcp-server-allow-host-name="` + host + `" nvme-tcp-server-password="pw-1"`)
}

// The state file keeps the passwords (each one's secret follows from it),
// so only the simulator's user may read it.
func TestStateFileWithPasswordsIsPrivate(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("d1", "1G"))
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="nqn.2014-08.org.nvmexpress:uuid:a" nvme-tcp-server-password="pw-1"`)
	st, err := os.Stat(filepath.Join(ts.cfg.DataDir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		t.Fatalf("the state file, which holds the password, has mode %v", st.Mode().Perm())
	}
}

// The command log (verbosity 2) shows a password set as hidden, never the
// password itself.
func TestCommandLogHidesThePassword(t *testing.T) {
	var logged strings.Builder
	var mu sync.Mutex
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged.WriteString(prefix + " " + args + "\n")
	}, funcr.Options{Verbosity: 2})
	ts := startSim(t, func(c *Config) { c.Logger = logger })
	ts.mustRun(addCmd("d1", "1G"))
	const password = "correct-horse-battery"
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="nqn.2014-08.org.nvmexpress:uuid:a" nvme-tcp-server-password="` + password + `"`)
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-password=` + password + `2 nvme-tcp-export=yes`)
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logged.String(), "nvme-tcp-server-password=") {
		t.Fatalf("the command is not logged at all:\n%s", logged.String())
	}
	if strings.Contains(logged.String(), password) {
		t.Fatalf("the log shows the password:\n%s", logged.String())
	}
}

// authHostDir makes host's directory in the fake nvmet root as configfs
// makes it on a kernel with CONFIG_NVME_TARGET_AUTH (with dhchap_key).
func authHostDir(t *testing.T, root, host string) string {
	t.Helper()
	dir := filepath.Join(root, "hosts", host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "dhchap_key"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// authHost is the allowed host of nvmetDiskWithPassword's disk.
const authHost = "nqn.2014-08.org.nvmexpress:uuid:a"

// nvmetDiskWithPassword starts a simulator on a fake nvmet root with disk
// d1 exported to host with password; it returns the host's directory.
func nvmetDiskWithPassword(t *testing.T, host, password string) (ts *testSim, root, hostDir string) {
	t.Helper()
	root = fakeNvmetRoot(t)
	ts = startNvmetSim(t, root)
	hostDir = authHostDir(t, root, host)
	ts.mustRun(addCmd("d1", "1G"))
	ts.mustRun(`/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="` + host + `" nvme-tcp-server-password="` + password + `"`)
	return ts, root, hostDir
}
