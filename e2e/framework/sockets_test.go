package framework

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// deepDir makes a directory whose path is at least n bytes long under
// base, like a checkout at a deep path.
func deepDir(t *testing.T, base string, n int) string {
	t.Helper()
	dir := base
	for len(dir) < n {
		dir = filepath.Join(dir, strings.Repeat("d", 40))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Issue 25: a socket's path does not grow with the checkout's (run from a
// 200-byte working directory, with a 200-byte TMPDIR too), and the longest
// socket name the framework uses binds there.
func TestSocketDirBounded(t *testing.T) {
	base := t.TempDir()
	t.Chdir(deepDir(t, base, 200))
	t.Setenv("TMPDIR", deepDir(t, base, 200))
	dir := SocketDir(t)
	sock := filepath.Join(dir, "rds-csi-driver-"+strings.Repeat("r", 30)+".sock")
	if err := checkSocketPath(sock); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("listen on %s (%d bytes): %v", sock, len(sock), err)
	}
	l.Close()
}

func TestCheckSocketPath(t *testing.T) {
	long := "/" + strings.Repeat("a", MaxSocketPath)
	if err := checkSocketPath(long); err == nil {
		t.Errorf("%d bytes accepted", len(long))
	}
	if err := checkSocketPath(long[:MaxSocketPath]); err != nil {
		t.Error(err)
	}
	// The kernel agrees about the limit.
	base, err := os.MkdirTemp("/tmp", "rdscsi-limit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := deepDir(t, base, 60) // ~70 bytes: room for the name
	for _, n := range []int{MaxSocketPath, MaxSocketPath + 1} {
		p := dir + "/" + strings.Repeat("s", n-len(dir)-1)
		l, err := net.Listen("unix", p)
		if l != nil {
			l.Close()
		}
		if ok := checkSocketPath(p) == nil; ok != (err == nil) {
			t.Errorf("%d bytes: checkSocketPath ok=%v, bind error %v", n, ok, err)
		}
	}
}
