//go:build review25

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// runs the driver in node mode with extra args and reports whether it
// came up serving.
func review25Node(t *testing.T, i int, extra ...string) (int, bool, string) {
	t.Helper()
	dir := t.TempDir()
	endpoint := "unix://" + filepath.Join(dir, fmt.Sprintf("csi-%d.sock", i))
	args := append([]string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-nvme-dir=" + filepath.Join(dir, "nvme"), "--endpoint=" + endpoint}, extra...)
	return startOrExit(t, args, endpoint)
}

// HOLE: --driver-name is only checked for emptiness. CSI requires a name
// of at most 63 characters, DNS-label-like ([a-z0-9.-], alphanumeric at
// both ends). "rds csi!" is accepted, the node plugin serves and the
// kubelet registration (and every CSIDriver/StorageClass naming it) fails
// far away from the flag instead of at start.
func TestReview25DriverNameValidated(t *testing.T) {
	for i, name := range []string{"rds csi!", "-rds.csi", strings.Repeat("a", 64) + ".srvlab.io"} {
		code, serving, stderr := review25Node(t, i, "--driver-name="+name)
		if serving || code != 1 || !strings.Contains(stderr, "--driver-name") {
			t.Errorf("--driver-name=%q: serving %v, exit %d, stderr %q: want a flag error naming --driver-name", name, serving, code, stderr)
		}
	}
}

// HOLE: --node-id is checked only inside the node service, after it has
// settled the host's NVMe identity: --node-id="n 1" (or "a/b",
// "UPPER_case") first creates --node-nvme-dir/hostnqn and hostid (the
// host's /etc/nvme), then stops with an error that tells the operator to
// "fix the file or the mount". Issue 25: flags are validated before the
// host is touched. Consequence: a typo in the DaemonSet writes a host
// identity on every node and points the operator at the wrong thing.
func TestReview25NodeIDValidatedBeforeTheHost(t *testing.T) {
	for i, id := range []string{"n 1", "a/b", "UPPER_case"} {
		dir := t.TempDir()
		nvmeDir := filepath.Join(dir, "nvme")
		endpoint := "unix://" + filepath.Join(dir, fmt.Sprintf("csi-%d.sock", i))
		args := []string{"--mode=node", "--node-id=" + id, "--rds-name=rds1", "--node-nvme-dir=" + nvmeDir, "--endpoint=" + endpoint}
		code, serving, stderr := startOrExit(t, args, endpoint)
		if serving || code != 1 || !strings.Contains(stderr, "--node-id") || strings.Contains(stderr, "fix the file or the mount") {
			t.Errorf("--node-id=%q: serving %v, exit %d, stderr %q: want a flag error naming --node-id, not the mount", id, serving, code, stderr)
		}
		if _, err := os.Stat(nvmeDir); err == nil {
			t.Errorf("--node-id=%q: the host's NVMe identity (%s) was created before the node ID was refused", id, nvmeDir)
		}
	}
}

// HOLE: a relative --node-nvme-dir ("etc/nvme", a missing leading slash)
// is accepted: the node service creates a fresh host identity relative to
// the container's working directory, i.e. not the host's /etc/nvme that
// the DaemonSet mounts, so the host NQN changes at every restart and the
// node loses its identity on the RDS. The flag's own help says it "must
// be the host's and persist across restarts".
func TestReview25RelativeNVMeDirRefused(t *testing.T) {
	wd := t.TempDir()
	old, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chdir(wd); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(old)
	endpoint := "unix://" + filepath.Join(wd, "csi.sock")
	args := []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-nvme-dir=etc/nvme", "--endpoint=" + endpoint}
	code, serving, stderr := startOrExit(t, args, endpoint)
	if serving || code != 1 || !strings.Contains(stderr, "--node-nvme-dir") {
		t.Errorf("relative --node-nvme-dir: serving %v, exit %d, stderr %q: want a flag error", serving, code, stderr)
	}
	if _, err := os.Stat(filepath.Join(wd, "etc/nvme")); err == nil {
		t.Errorf("a relative --node-nvme-dir created a host identity under the working directory")
	}
}

// HOLE: --nvme-address (and --rds-address with --rds-name) take any
// string: "10.0.0.1:4420" (a port in the address, with --nvme-port beside
// it) or "rds 1" start the controller, which hands the address to every
// node in the volume context; each NodeStage then fails with an nvme
// connect error far from the flag.
func TestReview25NVMeAddressValidated(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	if _, err := rdssim.WriteClientKey(keyFile, ""); err != nil {
		t.Fatal(err)
	}
	for i, tc := range [][]string{
		{"--nvme-address=10.0.0.1:4420"},
		{"--nvme-address=rds 1"},
		{"--rds-name=rds1", "--rds-address=10.0.0.1:22"},
	} {
		endpoint := "unix://" + filepath.Join(dir, fmt.Sprintf("csi-%d.sock", i))
		args := append([]string{"--endpoint=" + endpoint, "--mode=controller", "--publish=false", "--rds-address=127.0.0.1",
			"--rds-key-file=" + keyFile, "--rds-insecure-skip-host-key-check"}, tc...)
		code, serving, stderr := startOrExit(t, args, endpoint)
		if serving || code != 1 {
			t.Errorf("%v: serving %v, exit %d, stderr %q: want a flag error", tc, serving, code, stderr)
		}
	}
}

// HOLE: a flag given twice with different values (--mode=node
// --mode=controller, e.g. from a Helm extraArgs on top of the chart's own)
// is silently last-wins; the driver runs in a mode the operator may not
// expect. Low severity: Go flag convention, but issue 25 asks every bad
// input to be answered.
func TestReview25DuplicateFlagRefused(t *testing.T) {
	code, serving, stderr := review25Node(t, 0, "--mode=all", "--mode=node")
	if serving || code == 0 {
		t.Errorf("--mode given twice: serving %v, exit %d, stderr %q: want a refusal", serving, code, stderr)
	}
}
