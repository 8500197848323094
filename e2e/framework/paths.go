package framework

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"
)

// RequiredBinaries are the names in BinDir() every e2e test needs.
var RequiredBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "csi-provisioner", "csi-attacher"}

// RepoRoot is the directory of the repository's go.mod, found from the
// working directory upwards (go test runs in the package directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			regexp.MustCompile(`(?m)^module github.com/srvlab/rds-csi$`).Match(data) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the rds-csi repository (no go.mod of github.com/srvlab/rds-csi above the working directory)")
		}
		dir = parent
	}
}

func mustRepoRoot(tb testing.TB) string {
	tb.Helper()
	root, err := RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	return root
}

// BinDir is where hack/build-controlplane.sh leaves the binaries:
// $RDS_CSI_CACHE/bin, default <repo>/.cache/bin.
func BinDir(root string) string {
	if c := os.Getenv("RDS_CSI_CACHE"); c != "" {
		return filepath.Join(c, "bin")
	}
	return filepath.Join(root, ".cache", "bin")
}

// HaveBinary says whether BinDir holds an executable name (a sidecar that
// did not build is simply absent).
func HaveBinary(root, name string) bool {
	st, err := os.Stat(filepath.Join(BinDir(root), name))
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

var (
	ensureOnce sync.Once
	ensureErr  error
)

// EnsureBinaries makes sure RequiredBinaries exist, running
// hack/build-controlplane.sh once per test binary when one is missing
// (a cold build takes about ten minutes; its progress goes to stderr).
// With RDS_CSI_E2E_BUILD=0 a missing binary fails the test instead.
func EnsureBinaries(tb testing.TB) string {
	tb.Helper()
	root := mustRepoRoot(tb)
	ensureOnce.Do(func() {
		missing := missingBinaries(root)
		if len(missing) == 0 {
			return
		}
		if os.Getenv("RDS_CSI_E2E_BUILD") == "0" {
			ensureErr = fmt.Errorf("missing %v in %s: run hack/build-controlplane.sh (or make e2e) first", missing, BinDir(root))
			return
		}
		fmt.Fprintf(os.Stderr, "e2e: %v missing in %s; running hack/build-controlplane.sh (cold: ~10 min on 2 cores)\n", missing, BinDir(root))
		start := time.Now()
		cmd := exec.Command("bash", filepath.Join(root, "hack", "build-controlplane.sh"))
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		err := cmd.Run()
		fmt.Fprintf(os.Stderr, "e2e: hack/build-controlplane.sh finished in %s\n", time.Since(start).Round(time.Second))
		if missing := missingBinaries(root); len(missing) > 0 {
			ensureErr = fmt.Errorf("hack/build-controlplane.sh (%v) did not produce %v in %s; see .cache/build/logs", err, missing, BinDir(root))
		}
	})
	if ensureErr != nil {
		tb.Fatal(ensureErr)
	}
	return root
}

func missingBinaries(root string) []string {
	var missing []string
	for _, b := range RequiredBinaries {
		if !HaveBinary(root, b) {
			missing = append(missing, b)
		}
	}
	return missing
}

// ArtifactsRoot is where tests keep their run logs: $RDS_CSI_E2E_ARTIFACTS,
// default <repo>/e2e/artifacts (git-ignored).
func ArtifactsRoot(root string) string {
	if d := os.Getenv("RDS_CSI_E2E_ARTIFACTS"); d != "" {
		return d
	}
	return filepath.Join(root, "e2e", "artifacts")
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// newArtifactDir makes ArtifactsRoot/<test name>-<UTC time> and logs its path.
func newArtifactDir(tb testing.TB, root string) string {
	tb.Helper()
	name := unsafeName.ReplaceAllString(tb.Name(), "_")
	dir := filepath.Join(ArtifactsRoot(root), name+"-"+time.Now().UTC().Format("20060102T150405.000"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("artifacts (timeline.log, component logs): %s", dir)
	return dir
}
