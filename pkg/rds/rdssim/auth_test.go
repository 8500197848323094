package rdssim

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

func TestWrongKeyRefused(t *testing.T) {
	ts := startSim(t, nil)
	other, _, err := NewTestKeys()
	if err != nil {
		t.Fatal(err)
	}
	if c, err := ts.dial(other); err == nil {
		c.Close()
		t.Fatal("logged in with a key that is not authorized")
	} else if !strings.Contains(err.Error(), "unable to authenticate") {
		t.Errorf("error %v, want an authentication failure", err)
	}
	ts.srv.Close() // waits for the connection handlers: the counts are final
	if st := ts.srv.Stats(); st.HandshakeFailed != 1 || st.Accepted != 2 {
		t.Errorf("stats %+v", st)
	}
	if n := len(ts.srv.Commands()); n != 0 {
		t.Errorf("%d commands logged", n)
	}
}

func TestOnlyExecIsServed(t *testing.T) {
	ts := startSim(t, nil)
	sess, err := ts.client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.Shell(); err == nil {
		t.Error("shell request accepted")
	}
	if _, _, err := ts.client.OpenChannel("direct-tcpip", nil); err == nil {
		t.Error("direct-tcpip channel accepted")
	}
}

func TestHostKeyPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "host_key")
	k1, err := LoadOrGenerateHostKey(path)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := LoadOrGenerateHostKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(k1.PublicKey().Marshal(), k2.PublicKey().Marshal()) {
		t.Error("a second load generated a new key")
	}
	if k1.PublicKey().Type() != ssh.KeyAlgoED25519 {
		t.Errorf("key type %s", k1.PublicKey().Type())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(data, []byte("-----BEGIN OPENSSH PRIVATE KEY-----")) {
		t.Errorf("key file is not OpenSSH PEM: %.40q", data)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v", fi.Mode().Perm())
	}
	if err := os.WriteFile(path, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrGenerateHostKey(path); err == nil {
		t.Error("a broken key file was accepted (or replaced)")
	}
}

func knownHostsClient(t *testing.T, addr string, signer ssh.Signer, knownHostsFile string) (*ssh.Client, error) {
	t.Helper()
	cb, err := knownhosts.New(knownHostsFile)
	if err != nil {
		t.Fatal(err)
	}
	return ssh.Dial("tcp", addr, &ssh.ClientConfig{
		User:            "admin",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: cb,
		Timeout:         30 * time.Second,
	})
}

func TestKnownHosts(t *testing.T) {
	ts := startSim(t, nil)
	firstKey := ts.srv.HostPublicKey()
	kh := filepath.Join(t.TempDir(), "known_hosts")
	if err := ts.srv.WriteKnownHosts(kh); err != nil {
		t.Fatal(err)
	}
	c, err := knownHostsClient(t, ts.srv.Addr(), ts.signer, kh)
	if err != nil {
		t.Fatalf("pinned host key refused: %v", err)
	}
	c.Close()

	// The same data dir and host key file after a restart, on the same
	// address: the pinned entry still matches.
	addr := ts.srv.Addr()
	ts.stop()
	srv, err := New(ts.cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	c, err = knownHostsClient(t, addr, ts.signer, kh)
	if err != nil {
		t.Fatalf("pinned host key refused after restart: %v", err)
	}
	c.Close()
	srv.Close()
	if err := <-done; err != nil {
		t.Errorf("Serve after Close: %v", err)
	}

	// Another simulator (another host key) at a pinned address is refused.
	other := startSim(t, nil)
	line := knownhosts.Line([]string{other.srv.Addr()}, firstKey) + "\n"
	if err := os.WriteFile(kh, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := knownHostsClient(t, other.srv.Addr(), other.signer, kh); err == nil {
		c.Close()
		t.Error("a host key mismatch was accepted")
	}
}
