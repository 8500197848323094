package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
