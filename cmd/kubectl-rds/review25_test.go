//go:build review25

package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// HOLE: `kubectl rds why deployment web` is refused only after the
// kubeconfig is read (the kind is checked in why(), not checkArgs), so
// without a cluster at hand the user is told about the kubeconfig, not
// that "deployment" is no kind of why; main.go's own comment says the
// command line is checked before the kubeconfig is read.
func TestReview25WhyKindCheckedBeforeKubeconfig(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "nope")
	code, stdout, stderr := runCmd(t, nil, "", "why", "deployment", "web", "--kubeconfig", kc)
	if code != exitError || !strings.Contains(stderr, "deployment") || strings.Contains(stderr, "kubeconfig") || stdout != "" {
		t.Errorf("why deployment: exit %d, stdout %q, stderr %q: want the kind refused before the kubeconfig", code, stdout, stderr)
	}
}

// HOLE: --inventory-url is not validated: "localhost:8080/inventory"
// (the scheme left out of the documented http://localhost:8080/inventory)
// is taken as a URL of scheme "localhost" and only fails (or is reported
// as an unreachable inventory among the findings) after every API list,
// instead of a usage error naming the flag before the cluster is asked.
func TestReview25InventoryURLValidated(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "nope")
	for _, u := range []string{"localhost:8080/inventory", "ftp://localhost/inventory", "http://"} {
		code, _, stderr := runCmd(t, nil, "", "check", "--inventory-url", u, "--kubeconfig", kc)
		if code != exitError || !strings.Contains(stderr, "--inventory-url") {
			t.Errorf("--inventory-url %q: exit %d, stderr %q: want a usage error naming --inventory-url", u, code, stderr)
		}
	}
}

// HOLE: -h after a command (`kubectl rds why -h`) exits 0 but prints the
// usage on stderr, while `kubectl rds -h` prints it on stdout: help is
// not pipe-able (`kubectl rds why -h | less` shows nothing), unlike
// kubectl's and rdsctl's -h.
func TestReview25SubcommandHelpOnStdout(t *testing.T) {
	code, stdout, stderr := runCmd(t, nil, "", "why", "-h")
	if code != exitOK || !strings.Contains(stdout, "usage:") || stderr != "" {
		t.Errorf("why -h: exit %d, stdout %q, stderr %q: want the usage on stdout", code, stdout, stderr)
	}
}

// HOLE: -n/--namespace is not validated: -n Bad_NS (no namespace can
// have that name) reaches the kubeconfig and the API, where it reads as
// "pod not found", instead of a usage error.
func TestReview25NamespaceValidated(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "nope")
	code, _, stderr := runCmd(t, nil, "", "why", "pod", "web-0", "-n", "Bad_NS", "--kubeconfig", kc)
	if code != exitError || strings.Contains(stderr, "kubeconfig") || !strings.Contains(stderr, "Bad_NS") {
		t.Errorf("-n Bad_NS: exit %d, stderr %q: want a usage error naming the namespace before the kubeconfig", code, stderr)
	}
}

// HOLE: --driver "" (or a misspelt driver name) is accepted, and check on
// a cluster with a stale claim then matches no PV and says "OK: nothing
// wrong." with exit 0 (checked 0 PVs): an audit that silently audits
// nothing. Measured with the stale-claim world of main_test.go, where
// plain `check` exits 1.
func TestReview25CheckWithNoDriverIsNotOK(t *testing.T) {
	cl, _ := fakeClients(staleWorld()...)
	if code, _, _ := runCmd(t, cl, "", "check"); code != exitFindings {
		t.Fatalf("plain check: exit %d, want %d (the world has a stale claim)", code, exitFindings)
	}
	for _, driver := range []string{"", "rds.csi.srvlab.com"} {
		code, stdout, stderr := runCmd(t, cl, "", "check", "--driver", driver)
		if code == exitOK {
			t.Errorf("check --driver %q: exit 0 (%q, %q): an audit of no PV reported as a clean cluster", driver, stdout, stderr)
		}
	}
}
