package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// demoPlan runs hack/demo.sh in plan mode against cache and returns what
// it prints.
func demoPlan(t *testing.T, cache string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "../../../hack/demo.sh")
	cmd.Env = append(os.Environ(), "DEMO_PLAN_ONLY=1", "RDS_CSI_CACHE="+cache)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/demo.sh plan: %v\n%s", err, out)
	}
	return string(out)
}

// make demo builds only what the demo runs, and says up front how long
// that takes.
func TestDemoBuildsOnlyWhatItRuns(t *testing.T) {
	cache := t.TempDir()
	out := demoPlan(t, cache)
	first := strings.SplitN(out, "\n", 2)[0]
	for _, want := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "attacher", "provisioner", "snapshotter"} {
		if !strings.Contains(first, want) {
			t.Errorf("the plan %q does not build %s", first, want)
		}
	}
	for _, not := range []string{"kubectl", "resizer"} {
		if strings.Contains(first, not) {
			t.Errorf("the plan %q builds %s, which the demo does not run", first, not)
		}
	}
	// The estimate up front, within the 25 minutes a cold demo may take on
	// a 2-core machine.
	if m := regexp.MustCompile(`Estimate: about (\d+) min`).FindStringSubmatch(out); m == nil {
		t.Errorf("no estimate up front:\n%s", out)
	} else if n, _ := strconv.Atoi(m[1]); n < 1 || n > 25 {
		t.Errorf("estimate of %d min, outside 1-25 min:\n%s", n, out)
	}
	// With everything it runs present, nothing is built, whatever else is missing.
	bin := filepath.Join(cache, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "csi-attacher", "csi-provisioner", "csi-snapshotter", "snapshot-controller"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out := demoPlan(t, cache); !strings.Contains(out, "nothing to build") {
		t.Errorf("with the demo's binaries present:\n%s", out)
	}
}

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lineWith is the first line of text holding every one of subs.
func lineWith(t *testing.T, text, what string, subs ...string) string {
	t.Helper()
	for _, l := range strings.Split(text, "\n") {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			return l
		}
	}
	t.Fatalf("no line with %q in %s", subs, what)
	return ""
}

// The demo program is built with the settings of `make build` that are part
// of Go's build cache keys, so that it links the packages bin/ compiled just
// before. Built without -trimpath it compiled client-go, grpc and the
// standard library a second time: 246 s of a cold `make demo`.
func TestDemoProgramBuiltLikeBin(t *testing.T) {
	makefile := readRepoFile(t, "Makefile")
	mk := lineWith(t, makefile, "Makefile", "build", "./cmd/...")
	// The Makefile's own variables in the line, as make expands them.
	for _, l := range strings.Split(makefile, "\n") {
		if name, value, ok := strings.Cut(l, ":="); ok && !strings.ContainsAny(strings.TrimSpace(name), " \t") {
			mk = strings.ReplaceAll(mk, "$("+strings.TrimSpace(name)+")", strings.TrimSpace(value))
		}
	}
	demo := lineWith(t, readRepoFile(t, "hack/demo.sh"), "hack/demo.sh", "go build", "./e2e/cmd/demo")
	for _, flag := range []string{"-trimpath", "-race", "-tags", "-gcflags", "-asmflags", "CGO_ENABLED", "-buildmode", "-cover"} {
		if strings.Contains(mk, flag) != strings.Contains(demo, flag) {
			t.Errorf("%s differs between make build (%q) and the demo program's build (%q)", flag, strings.TrimSpace(mk), strings.TrimSpace(demo))
		}
	}
	if !strings.Contains(readRepoFile(t, "hack/demo.sh"), "make --no-print-directory build") {
		t.Error("hack/demo.sh does not build bin/ with make build")
	}
}

// By default all four sidecars build in the kube wrapper module, where
// they compile only their own packages (8-24 s each, cold); from their own
// modules each takes 4-6 min on the 2-core machine.
func TestAllSidecarsShareTheKubeWrapper(t *testing.T) {
	m := regexp.MustCompile(`(?m)^SHARED_SIDECARS="\$\{SHARED_SIDECARS-([^}]*)\}"`).FindStringSubmatch(readRepoFile(t, "hack/build-controlplane.sh"))
	if m == nil {
		t.Fatal("no SHARED_SIDECARS default in hack/build-controlplane.sh")
	}
	got := strings.Fields(m[1])
	sort.Strings(got)
	if want := []string{"attacher", "provisioner", "resizer", "snapshotter"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("SHARED_SIDECARS defaults to %q, want %q", got, want)
	}
}
