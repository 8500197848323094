package rdssim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// testSim is a simulator on loopback with an SSH client logged in to it.
type testSim struct {
	t      *testing.T
	cfg    Config
	srv    *Server
	signer ssh.Signer
	client *ssh.Client
}

// fakeClock is a settable Config.Now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func startSim(t *testing.T, mod func(*Config)) *testSim {
	t.Helper()
	signer, pub, err := NewTestKeys()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		DataDir:        filepath.Join(t.TempDir(), "pool"),
		PoolSize:       100 * gib,
		HostKeyPath:    filepath.Join(t.TempDir(), "host_key"),
		AuthorizedKeys: []ssh.PublicKey{pub},
	}
	if mod != nil {
		mod(&cfg)
	}
	ts := &testSim{t: t, cfg: cfg, signer: signer}
	ts.start()
	t.Cleanup(ts.stop)
	return ts
}

func (ts *testSim) start() {
	ts.t.Helper()
	srv, err := New(ts.cfg)
	if err != nil {
		ts.t.Fatal(err)
	}
	if _, err := srv.Start("127.0.0.1:0"); err != nil {
		ts.t.Fatal(err)
	}
	ts.srv = srv
	c, err := ts.dial(ts.signer)
	if err != nil {
		ts.t.Fatal(err)
	}
	ts.client = c
}

func (ts *testSim) stop() {
	if ts.client != nil {
		ts.client.Close()
		ts.client = nil
	}
	if ts.srv != nil {
		ts.srv.Close()
		ts.srv = nil
	}
}

// restart stops the simulator and starts a new one on the same data dir.
func (ts *testSim) restart() {
	ts.t.Helper()
	ts.stop()
	ts.start()
}

func (ts *testSim) dial(signer ssh.Signer) (*ssh.Client, error) {
	return ssh.Dial("tcp", ts.srv.Addr(), &ssh.ClientConfig{
		User:            "admin",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.FixedHostKey(ts.srv.HostPublicKey()),
		Timeout:         30 * time.Second,
	})
}

// redial replaces the client's connection (after a dropped one).
func (ts *testSim) redial() {
	ts.t.Helper()
	if ts.client != nil {
		ts.client.Close()
	}
	c, err := ts.dial(ts.signer)
	if err != nil {
		ts.t.Fatal(err)
	}
	ts.client = c
}

// tryRun runs one command in its own session, as the client does.
func (ts *testSim) tryRun(cmd string) (string, error) {
	sess, err := ts.client.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	out, err := sess.CombinedOutput(cmd)
	return string(out), err
}

// run runs a command that must get a reply with exit status 0.
func (ts *testSim) run(cmd string) string {
	ts.t.Helper()
	out, err := ts.tryRun(cmd)
	if err != nil {
		ts.t.Fatalf("%s: %v (output %q)", cmd, err, out)
	}
	return out
}

// mustRun runs a command that must print nothing (success).
func (ts *testSim) mustRun(cmd string) {
	ts.t.Helper()
	if out := ts.run(cmd); out != "" {
		ts.t.Fatalf("%s: unexpected output %q", cmd, out)
	}
}

func (ts *testSim) hostFile(rel string) string {
	return filepath.Join(ts.cfg.DataDir, filepath.FromSlash(rel))
}

func addCmd(slot string, size string) string {
	return fmt.Sprintf(`/disk add type=file file-path="/storage-pool/k8s/%s.img" file-size=%s slot="%s" nvme-tcp-export=yes nvme-tcp-server-port=4420 nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:%s"`, slot, size, slot, slot)
}

func copyCmd(slot, from, extra string) string {
	return strings.TrimSpace(fmt.Sprintf(`/disk add type=file file-path="/storage-pool/k8s/%s.img" slot="%s" copy-from=[find slot="%s"] nvme-tcp-export=no %s`, slot, slot, from, extra))
}

// listFiles returns every path under dir, relative, for "nothing left
// behind" checks.
func listFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
