package exportauth

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/nacl/box"

	"github.com/srvlab/rds-csi/pkg/nvme"
)

func secret(t *testing.T, b byte) nvme.DHCHAPSecret {
	t.Helper()
	s, err := nvme.NewDHCHAPSecret(bytes.NewReader(bytes.Repeat([]byte{b}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func key(t *testing.T, b byte) *NodeKey {
	t.Helper()
	k, err := NewNodeKey(bytes.NewReader(bytes.Repeat([]byte{b}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSealOpensOnlyForItsNode(t *testing.T) {
	a, b := key(t, 1), key(t, 2)
	s := secret(t, 9)
	sealed, err := Seal(s, a.Public, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, s.Reveal()[10:20]) {
		t.Fatal("the sealed form shows the secret")
	}
	got, err := a.Open(sealed)
	if err != nil || !got.Equal(s) {
		t.Fatalf("Open = %v, %v", got, err)
	}
	if _, err := b.Open(sealed); !errors.Is(err, ErrWrongKey) || !errors.Is(err, ErrSealed) {
		t.Fatalf("another node opened it: %v", err)
	}
	// Two seals of one secret differ (an ephemeral key each), so a
	// VolumeAttachment's status does not tell whether two attachments
	// share a secret.
	again, err := Seal(s, a.Public, rand.Reader)
	if err != nil || again == sealed {
		t.Fatalf("two seals are equal (%v)", err)
	}
}

func TestOpenRefusesBadInput(t *testing.T) {
	k := key(t, 1)
	notASecret, err := box.SealAnonymous(nil, []byte("hunter2"), (*[32]byte)(&k.Public), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := Seal(secret(t, 3), k.Public, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for name, in := range map[string]string{
		"empty":                         "",
		"not base64url":                 "!!!",
		"truncated":                     sealed[:len(sealed)-4],
		"sealed, but not a DHHC-1 form": b64.EncodeToString(notASecret),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := k.Open(in)
			if !errors.Is(err, ErrSealed) {
				t.Fatalf("Open = %v, want ErrSealed", err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("the error shows the content: %v", err)
			}
		})
	}
	if _, err := Seal(nvme.DHCHAPSecret{}, k.Public, rand.Reader); err == nil {
		t.Fatal("sealed an empty secret")
	}
}

func TestPublicKeyRoundTrips(t *testing.T) {
	k := key(t, 5)
	s := k.Public.String()
	if !strings.HasPrefix(s, PublicKeyPrefix) || len(s) != len(PublicKeyPrefix)+43 {
		t.Fatalf("public key form %q", s)
	}
	p, err := ParsePublicKey(s)
	if err != nil || p != k.Public {
		t.Fatalf("ParsePublicKey = %v, %v", p, err)
	}
	for _, bad := range []string{"", "nqn.2014-08.org.nvmexpress:uuid:x", PublicKeyPrefix + "short", PublicKeyPrefix + strings.Repeat("A", 44)} {
		if _, err := ParsePublicKey(bad); err == nil {
			t.Errorf("ParsePublicKey(%q) accepted it", bad)
		}
	}
}

func TestLoadOrCreateNodeKeyKeepsTheKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "node.key")
	a, err := LoadOrCreateNodeKey(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v (%v), want 0600", st.Mode(), err)
	}
	if dst, _ := os.Stat(filepath.Dir(path)); dst.Mode().Perm() != 0o700 {
		t.Fatalf("key directory mode %v, want 0700", dst.Mode())
	}
	b, err := LoadOrCreateNodeKey(path)
	if err != nil || b.Public != a.Public {
		t.Fatalf("the key changed across a restart: %v", err)
	}
	sealed, err := Seal(secret(t, 4), a.Public, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Open(sealed); err != nil {
		t.Fatalf("a restarted plugin cannot open what was sealed before: %v", err)
	}
	if err := os.WriteFile(path, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateNodeKey(path); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Fatalf("a damaged key file: %v", err)
	}
}

// The key file is written through a temporary file beside it. One left
// over (a crash between write and rename) or planted there must neither
// lend the key its mode nor, as a symlink, carry the key elsewhere.
func TestLoadOrCreateNodeKeyIgnoresALeftoverTemporaryFile(t *testing.T) {
	t.Run("world-readable", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "node.key")
		if err := os.WriteFile(path+".new", []byte("left over\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateNodeKey(path); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("key file mode %v (%v), want 0600", st.Mode(), err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		path, elsewhere := filepath.Join(dir, "node.key"), filepath.Join(dir, "elsewhere")
		if err := os.WriteFile(elsewhere, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(elsewhere, path+".new"); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadOrCreateNodeKey(path); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(elsewhere); len(b) != 0 {
			t.Fatalf("the private key was written through a symlink to %s", elsewhere)
		}
		if st, err := os.Lstat(path); err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
			t.Fatalf("key file %v (%v), want a regular file of mode 0600", st.Mode(), err)
		}
	})
}

// A key file that is a symlink is refused, not followed: inside the node
// plugin's container it resolves in the container's filesystem, not the
// host's, and a link to a file others can write hands them the key.
func TestLoadOrCreateNodeKeyRefusesASymlink(t *testing.T) {
	dir := t.TempDir()
	real, path := filepath.Join(dir, "real.key"), filepath.Join(dir, "node.key")
	if _, err := LoadOrCreateNodeKey(real); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, path); err != nil {
		t.Fatal(err)
	}
	_, err := LoadOrCreateNodeKey(path)
	if err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("a key file that is a symlink: err = %v, want a refusal naming the symlink", err)
	}
}

// Two node plugins starting at once on one node (a DaemonSet rolling
// update with surge) must end up with the one key the file keeps: a
// plugin that registered a key the file does not hold cannot open what is
// sealed to it after its next restart.
func TestLoadOrCreateNodeKeyConcurrentStartsAgree(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.key")
	const plugins = 16
	keys := make([]*NodeKey, plugins)
	errs := make([]error, plugins)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range plugins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			keys[i], errs[i] = LoadOrCreateNodeKey(path)
		}()
	}
	close(start)
	wg.Wait()
	kept, err := LoadOrCreateNodeKey(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range plugins {
		if errs[i] == nil && keys[i].Public != kept.Public {
			t.Fatalf("plugin %d uses key %s, the file keeps %s", i, keys[i].Public, kept.Public)
		}
	}
}
