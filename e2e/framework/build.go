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

// GoBuild is a command of this repository built once per test binary
// into .cache/e2e/<Name>. Tests side by side wait for the one build; it is
// written under a temporary name and renamed, so that a process running
// the previous file (another test, another checkout's run sharing the
// cache) keeps it: a go build -o over a running binary fails ("text file
// busy") or leaves a half-written one.
type GoBuild struct {
	Name  string   // file name in .cache/e2e
	Flags []string // go build flags, e.g. -race
	Pkg   string   // e.g. ./cmd/rds-csi-driver

	once sync.Once
	bin  string
	err  error
}

// Path builds the command the first time and returns its path; a failed
// build fails tb, and every later caller.
func (b *GoBuild) Path(tb testing.TB, tl *Timeline, root string) string {
	tb.Helper()
	b.once.Do(func() {
		done := tl.Step(strings.Join(append(append([]string{"go build"}, b.Flags...), b.Pkg), " "))
		out := filepath.Join(root, ".cache", "e2e", b.Name)
		if b.err = os.MkdirAll(filepath.Dir(out), 0o755); b.err != nil {
			return
		}
		tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
		cmd := exec.Command("go", append(append([]string{"build"}, b.Flags...), "-o", tmp, b.Pkg)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %w\n%s", b.Pkg, err, out)
			return
		}
		if b.err = os.Rename(tmp, out); b.err == nil {
			b.bin = out
		}
		done()
	})
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.bin
}
