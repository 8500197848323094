//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// Issue 25: from a clone at an ordinary Go path
// (/root/src/github.com/srvlab/rds-csi) the driver's socket was
// e2e/artifacts/<test>-<time>/rds-csi-driver-ctrl-a.sock, 119 bytes, past
// the kernel's 108 ("bind: invalid argument"). Here the artifact directory
// is 200 bytes long; the driver must still come up and answer Probe
// (StartDriver fails the test otherwise). No control plane needed.
func TestDriverSocketWithDeepArtifactDir(t *testing.T) {
	t.Parallel()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for len(dir) < 200 {
		dir = filepath.Join(dir, strings.Repeat("a", 40))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tl := framework.NewTimeline(t, dir)
	sim := framework.StartSim(t, tl, dir, framework.SimOptions{})
	bin := framework.BuildDriver(t, tl, root)
	d := framework.StartDriver(t, tl, bin, dir, sim, nil, framework.DriverOptions{Name: "rds-csi-driver-ctrl-a"})
	t.Logf("artifact directory %d bytes; driver socket %s (%d bytes)", len(dir), d.Socket, len(d.Socket))
}
