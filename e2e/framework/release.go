package framework

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Release is a published release of the driver: its version and the
// commit it was built from.
type Release struct {
	Version string
	Commit  string // full hash
	// VersionVar is the variable its build stamps the version into (the
	// -X linker flag of its own Makefile).
	VersionVar string
}

// PreviousRelease is the release the upgrade, downgrade and skew tests
// start from or go back to: the one before the file VERSION's. Until
// releases are tagged it is a commit of this repository's history, pinned
// here and nowhere else (docs/release.md): the builds users ran as v0.1.0.
// A new release moves it to the release before it.
var PreviousRelease = Release{
	Version:    "v0.1.0",
	Commit:     "8911e3c23dd21f66c1e2081b6d03649a227924c6",
	VersionVar: "github.com/srvlab/rds-csi/pkg/csi.Version",
}

var (
	releaseBuilds sync.Map // commit -> *releaseBuild
	currentOnce   sync.Once
	currentBuild  *GoBuild
	currentVer    string
)

type releaseBuild struct {
	once sync.Once
	bin  string
	err  error
}

// RequireRelease fails tb in CI, and skips it elsewhere, with the reason,
// when r cannot be built here: its commit is not in this clone's history
// (a shallow clone, or a source archive). Call it before starting what
// the test needs it for.
func RequireRelease(tb testing.TB, r Release) {
	tb.Helper()
	root := mustRepoRoot(tb)
	if err := exec.Command("git", "-C", root, "cat-file", "-e", r.Commit+"^{commit}").Run(); err == nil {
		return
	}
	shallow, _ := exec.Command("git", "-C", root, "rev-parse", "--is-shallow-repository").Output()
	why := fmt.Sprintf("the previous release %s (commit %s, pinned in e2e/framework/release.go) is not in this clone's history (shallow: %s); "+
		"fetch it (git fetch --unshallow), or clone the whole history (the workflows check out with fetch-depth: 0)",
		r.Version, r.Commit, strings.TrimSpace(string(shallow)))
	if os.Getenv("CI") != "" {
		tb.Fatal(why)
	}
	tb.Skip(why)
}

// BuildRelease builds cmd/rds-csi-driver as it was at r.Commit, from this
// clone's history (git archive of the commit into
// .cache/e2e/release-<commit>/src, a fixed path, so Go's cache serves a
// rebuild), with the race detector like the current build, once per test
// binary and once per cache. RequireRelease first: without the commit
// this fails.
func BuildRelease(tb testing.TB, tl *Timeline, root string, r Release) string {
	tb.Helper()
	v, _ := releaseBuilds.LoadOrStore(r.Commit, &releaseBuild{})
	b := v.(*releaseBuild)
	b.once.Do(func() {
		out := filepath.Join(root, ".cache", "e2e", fmt.Sprintf("rds-csi-driver-%s-%s", r.Version, r.Commit[:12]))
		if st, err := os.Stat(out); err == nil && st.Mode().IsRegular() {
			b.bin = out
			return
		}
		done := tl.Step(fmt.Sprintf("build the previous release %s (%s) from the history", r.Version, r.Commit[:12]))
		defer done()
		src := filepath.Join(root, ".cache", "e2e", "release-"+r.Commit[:12], "src")
		if err := os.RemoveAll(src); err != nil {
			b.err = err
			return
		}
		if err := os.MkdirAll(src, 0o755); err != nil {
			b.err = err
			return
		}
		archive := exec.Command("bash", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "archive", root, r.Commit, src)
		if o, err := archive.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("git archive %s: %w\n%s", r.Commit, err, o)
			return
		}
		tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
		cmd := exec.Command("go", "build", "-race", "-ldflags", "-X "+r.VersionVar+"="+r.Version, "-o", tmp, "./cmd/rds-csi-driver")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
		if o, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build of %s at %s: %w\n%s", r.Version, r.Commit, err, o)
			return
		}
		if b.err = os.Rename(tmp, out); b.err == nil {
			b.bin = out
		}
	})
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.bin
}

// CurrentVersion is this checkout's version (hack/version.sh).
func CurrentVersion(tb testing.TB, root string) string {
	tb.Helper()
	out, err := exec.Command(filepath.Join(root, "hack", "version.sh")).Output()
	if err != nil {
		tb.Fatalf("hack/version.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// BuildCurrent builds this checkout's cmd/rds-csi-driver as the release
// tests run it: the race detector like BuildDriver's, stamped with the
// checkout's version (hack/version.sh) rather than "e2e", so that every
// replica's GetPluginInfo says which build it runs.
func BuildCurrent(tb testing.TB, tl *Timeline, root string) (bin, version string) {
	tb.Helper()
	currentOnce.Do(func() {
		currentVer = CurrentVersion(tb, root)
		currentBuild = &GoBuild{Name: "rds-csi-driver-current", Flags: []string{"-race", "-ldflags", "-X github.com/srvlab/rds-csi/pkg/version.Version=" + currentVer}, Pkg: "./cmd/rds-csi-driver"}
	})
	return currentBuild.Path(tb, tl, root), currentVer
}
