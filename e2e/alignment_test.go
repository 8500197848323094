//go:build e2e

package e2e

import (
	"debug/buildinfo"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/e2e/framework"
)

// The shipped driver and kube-apiserver are built from the same versions of
// the modules they share (client-go, apimachinery, grpc, protobuf, x/net ...)
// with the same build settings, so that each package they share is one Go
// build cache entry: a cold `make demo` compiles it once, not once for bin/
// and once for the control plane (hack/README.md, "Sharing with the driver").
// This fails when go.mod, the Makefile and hack/build-controlplane.sh drift
// apart, e.g. a dependency bumped in go.mod that the control-plane wrapper
// module selects at another version.
func TestDriverSharesPackagesWithControlPlane(t *testing.T) {
	root := framework.EnsureBinaries(t)

	// The driver as `make build` makes it.
	bin := t.TempDir()
	mk := exec.Command("make", "--no-print-directory", "build", "BIN="+bin)
	mk.Dir = root
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	drv, err := buildinfo.ReadFile(filepath.Join(bin, "rds-csi-driver"))
	if err != nil {
		t.Fatal(err)
	}
	kas, err := buildinfo.ReadFile(filepath.Join(framework.BinDir(root), "kube-apiserver"))
	if err != nil {
		t.Fatal(err)
	}

	// Settings that are part of every package's cache key.
	for _, k := range []string{"CGO_ENABLED", "-trimpath", "-buildmode", "-compiler", "-gcflags", "-tags", "-race", "-asan", "-msan", "GOOS", "GOARCH", "GOAMD64", "GOEXPERIMENT"} {
		if d, c := setting(drv, k), setting(kas, k); d != c {
			t.Errorf("build setting %s: %q for the driver (make build), %q for kube-apiserver (hack/build-controlplane.sh)", k, d, c)
		}
	}

	// The wrapper module kube-apiserver is built in, made for this go.mod.
	wr := exec.Command("bash", filepath.Join(root, "hack", "build-controlplane.sh"))
	wr.Dir = root
	wr.Env = append(os.Environ(), "WRAPPER_ONLY=1")
	wr.Stderr = os.Stderr
	out, err := wr.Output()
	if err != nil {
		t.Fatalf("WRAPPER_ONLY=1 hack/build-controlplane.sh: %v\n%s", err, out)
	}
	lines := strings.Fields(strings.TrimSpace(string(out)))
	if len(lines) == 0 {
		t.Fatalf("WRAPPER_ONLY=1 hack/build-controlplane.sh printed no directory")
	}
	list := exec.Command("go", "list", "-m", "-f", "{{.Path}} {{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}", "all")
	list.Dir = lines[len(lines)-1]
	list.Stderr = os.Stderr
	lout, err := list.Output()
	if err != nil {
		t.Fatalf("go list -m all in %s: %v", list.Dir, err)
	}
	wrapper := map[string]string{}
	for _, l := range strings.Split(string(lout), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			wrapper[f[0]] = f[1]
		}
	}

	inKube := map[string]bool{}
	for _, m := range kas.Deps {
		inKube[m.Path] = true
	}
	var shared, differ []string
	for _, m := range drv.Deps {
		if !inKube[m.Path] {
			continue
		}
		shared = append(shared, m.Path)
		if got, want := version(m), wrapper[m.Path]; got != want {
			differ = append(differ, m.Path+": "+got+" in go.mod, "+want+" for kube-apiserver")
		}
	}
	slices.Sort(differ)
	if len(differ) > 0 {
		t.Errorf("%d of the %d modules compiled into both the driver and kube-apiserver differ in version; align go.mod (k8s.io staging modules at the control plane's version, the rest at least what the wrapper selects):\n  %s",
			len(differ), len(shared), strings.Join(differ, "\n  "))
	}
	// Not a vacuous pass: the heavy ones are among them.
	for _, m := range []string{"k8s.io/client-go", "k8s.io/api", "k8s.io/apimachinery", "google.golang.org/grpc", "google.golang.org/protobuf", "golang.org/x/net"} {
		if !slices.Contains(shared, m) {
			t.Errorf("%s is not compiled into both binaries (shared: %v)", m, shared)
		}
	}
	t.Logf("%d modules shared by the driver and kube-apiserver, %d at another version", len(shared), len(differ))
}

func setting(bi *buildinfo.BuildInfo, key string) string {
	for _, s := range bi.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

func version(m *debug.Module) string {
	if m.Replace != nil {
		return m.Replace.Version
	}
	return m.Version
}
