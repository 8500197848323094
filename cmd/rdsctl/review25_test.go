//go:build review25

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// HOLE: bad arguments are answered with exit 1 ("the command failed"),
// not 2 (usage error, "nothing was done"), unlike a malformed export
// (59527a4) or an unknown command: a script cannot tell `get "a b"` or
// `create pvc-1 10X` from an RDS failure.
func TestReview25BadArgumentsAreUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"get", "a b"},
		{"create", "pvc-1", "10X"},
		{"create", "pvc-1", "0"},
		{"resize", "pvc-1", "1Q"},
		{"delete", "../x"},
		{"allow-host", "pvc-1", "notnqn"},
	} {
		var stdout, stderr bytes.Buffer
		if code := cli(append(closedRDS(t), args...), &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2 (usage error): %q", args, code, stderr.String())
		}
	}
}

// HOLE: a size argument that starts with '-' ("create pvc-1 -1", a
// negative size) is taken for a flag: stderr has two lines, the flag
// package's own "flag provided but not defined: -1" and rdsctl's, and
// neither says the size is wrong (issue 25: size errors name the input;
// a flag error is one line).
func TestReview25NegativeSize(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := cli(append(closedRDS(t), "create", "pvc-1", "-1"), &stdout, &stderr)
	out := strings.TrimSpace(stderr.String())
	if code != 2 || strings.Count(out, "\n") != 0 || !strings.Contains(out, "size") {
		t.Errorf("create pvc-1 -1: exit %d, stderr %q: want one line naming the size", code, out)
	}
}

// HOLE: gen-key creates PATH exclusively but overwrites an existing
// PATH.pub: `rdsctl gen-key ~/.ssh/id_ed25519` next to an existing
// id_ed25519.pub (whose private key was moved away) replaces that public
// key without a word.
func TestReview25GenKeyKeepsExistingPub(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(path+".pub", []byte("ssh-ed25519 AAAA keep-me\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := cli([]string{"gen-key", path}, &stdout, &stderr)
	b, _ := os.ReadFile(path + ".pub")
	if !strings.Contains(string(b), "keep-me") {
		t.Errorf("gen-key overwrote the existing %s.pub (exit %d, %q)", path, code, stdout.String())
	}
	if code == 0 {
		t.Errorf("gen-key succeeded although %s.pub existed", path)
	}
}

// HOLE: -address with a port ("127.0.0.1:22", the form ssh users type)
// is not validated: rdsctl dials "[127.0.0.1:22]:22" and reports a
// "transient RDS transport failure ... no such host" (exit 1, after its
// retries) instead of a usage error naming -address and pointing at -port.
func TestReview25AddressWithPort(t *testing.T) {
	key := filepath.Join(t.TempDir(), "id_ed25519")
	if _, err := rdssim.WriteClientKey(key, ""); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := cli([]string{"-address", "127.0.0.1:22", "-key", key, "-insecure-skip-host-key-check", "-timeout", "5s", "probe"}, &stdout, &stderr)
	if code != 2 || !strings.Contains(stderr.String(), "-address") {
		t.Errorf("-address 127.0.0.1:22: exit %d, stderr %q: want a usage error naming -address", code, stderr.String())
	}
}
