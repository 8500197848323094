package rdssim

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/crypto/ssh"
)

// A client key written by WriteClientKey logs in; the data WriteDisk puts
// on a disk is what ReadDisk and a snapshot copy of it hold.
func TestClientKeyFileAndDiskData(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "id_ed25519")
	pub, err := WriteClientKey(keyFile, "test")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(keyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", st, err)
	}
	pem, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	ts := startSim(t, func(c *Config) { c.AuthorizedKeys = append(c.AuthorizedKeys, pub) })
	c, err := ts.dial(signer)
	if err != nil {
		t.Fatalf("login with the written key: %v", err)
	}
	c.Close()

	ts.mustRun(addCmd("src", "1G"))
	marker := []byte("written through WriteDisk")
	if err := ts.srv.WriteDisk("src", 1<<20, marker); err != nil {
		t.Fatal(err)
	}
	ts.mustRun(copyCmd("copy", "src", ""))
	for _, slot := range []string{"src", "copy"} {
		got, err := ts.srv.ReadDisk(slot, 1<<20, len(marker))
		if err != nil || !bytes.Equal(got, marker) {
			t.Errorf("ReadDisk(%s) = %q, %v; want %q", slot, got, err, marker)
		}
	}
	if _, err := ts.srv.ReadDisk("nope", 0, 1); !errors.Is(err, ErrNotFound) {
		t.Errorf("ReadDisk of an unknown slot: %v, want ErrNotFound", err)
	}
	if err := ts.srv.WriteDisk("nope", 0, marker); !errors.Is(err, ErrNotFound) {
		t.Errorf("WriteDisk of an unknown slot: %v, want ErrNotFound", err)
	}
}
