package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Fixed HOLE (issue 25 review): --endpoint=unix://<path of an existing regular file>: csi.Listen
// removes whatever is at the path ("stale socket") without checking that
// it is a socket, so a typo such as --endpoint=unix:///etc/nvme/hostnqn or
// a path to a data file deletes that file, even when the driver then stops
// with a configuration error (here: the controller has no Kubernetes API).
// Consequence: data loss on the host from a bad flag.
func TestReview25EndpointRemovesRegularFile(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "hostnqn")
	if err := os.WriteFile(victim, []byte("nqn.2014-08.org.nvmexpress:uuid:keep-me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	endpoint := "unix://" + victim
	args := []string{"--endpoint=" + endpoint, "--mode=controller", "--rds-address=10.0.0.1",
		"--rds-key-file=" + dir + "/key", "--rds-known-hosts-file=" + dir + "/kh", "--kubeconfig=" + dir + "/nope"}
	code, serving, stderr := startOrExit(t, args, endpoint)
	if serving || code != 1 {
		t.Fatalf("serving %v, exit %d: %s", serving, code, stderr)
	}
	b, err := os.ReadFile(victim)
	if err != nil || !strings.Contains(string(b), "keep-me") {
		t.Errorf("a regular file at the --endpoint path was removed by a driver that then failed (%q): %v", stderr, err)
	}
}
