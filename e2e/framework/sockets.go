package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// MaxSocketPath is the longest unix socket path Linux binds: sun_path is
// 108 bytes with the terminating NUL. A longer one fails with "bind:
// invalid argument".
const MaxSocketPath = 107

// socketBase is where socket directories go: $TMPDIR when it is short,
// else /tmp. Never the artifact directory: it lives under the checkout,
// and e2e/artifacts/<test>-<time>/ alone is 60-70 bytes, so a checkout
// path longer than about 20 bytes (/root/src/github.com/srvlab/rds-csi is
// 35) put the driver's socket past the limit.
func socketBase() string {
	if d := os.TempDir(); filepath.IsAbs(d) && len(d) <= 40 {
		return d
	}
	return "/tmp"
}

// SocketDir makes a short directory for one test's unix sockets
// ($TMPDIR or /tmp, "rdscsi-<random>", at most ~50 bytes, whatever the
// checkout path), removed in tb.Cleanup. Logs stay in the artifact
// directory; only sockets go here.
func SocketDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp(socketBase(), "rdscsi-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// checkSocketPath explains a socket path the kernel would refuse.
func checkSocketPath(path string) error {
	if len(path) > MaxSocketPath {
		return fmt.Errorf("unix socket path %q is %d bytes, over the kernel's limit of %d; put it in a short directory (framework.SocketDir)", path, len(path), MaxSocketPath)
	}
	return nil
}
