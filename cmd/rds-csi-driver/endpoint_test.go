package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --endpoint=unix://<path of an existing regular file> never removes that
// file: csi.Listen removes a stale socket at the path only once it has
// checked that it is a socket. A typo such as
// --endpoint=unix:///etc/nvme/hostnqn, or a path to a data file, loses no
// data on the host, also when the driver then stops with a configuration
// error (here: the controller has no Kubernetes API).
func TestEndpointNeverRemovesARegularFile(t *testing.T) {
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

// A second start on the socket of a driver that is serving leaves the live
// driver on it. Were csi.Listen to remove whatever socket is at
// --endpoint, a configuration error found after it (here an unreadable
// --rds-key-file) would close that listener, unlinking the path: kubelet
// and the sidecars would lose the live driver. The files are read before
// the endpoint is opened, and a socket that answers is refused, not
// replaced, even when every flag and file is good (the node case).
func TestBadStartKeepsALiveSocket(t *testing.T) {
	for _, tc := range []struct {
		name string
		args func(dir string) []string
		want func(sock string) string
	}{
		{"missing key file", func(dir string) []string {
			return []string{"--mode=controller", "--rds-address=127.0.0.1", "--publish=false", "--rds-key-file=" + filepath.Join(dir, "missing")}
		}, func(string) string { return "reading SSH key" }},
		{"a node plugin that would start", func(dir string) []string {
			return []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-nvme-dir=" + filepath.Join(dir, "nvme")}
		}, func(sock string) string { return "another process serves on " + sock }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "csi.sock")
			live := liveSocket(t, sock)
			endpoint := "unix://" + sock
			code, serving, stderr := startOrExit(t, append(tc.args(dir), "--endpoint="+endpoint), endpoint)
			if serving || code != 1 || !strings.Contains(stderr, tc.want(sock)) {
				t.Errorf("serving %v, exit %d (%q), want exit 1 naming %q", serving, code, stderr, tc.want(sock))
			}
			if c, err := net.Dial("unix", sock); err != nil {
				t.Errorf("the live driver is unreachable after a failed second start: %v", err)
			} else {
				c.Close()
			}
			live.Close()
			if _, err := os.Stat(filepath.Join(dir, "nvme")); err == nil {
				t.Errorf("the refused start touched the host's NVMe identity")
			}
		})
	}
}

// liveSocket listens on sock as a live driver would, answering every
// connection by closing it (so that a gRPC client retries at once rather
// than waiting for a handshake), until the test closes it.
func liveSocket(t *testing.T, sock string) net.Listener {
	t.Helper()
	live, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.Close() })
	go func() {
		for {
			c, err := live.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return live
}

// A failed start leaves no directories behind: the RDS key is read before
// the socket's parent directories are created, and a start that fails
// after the socket is opened (here: the node identity directory is a
// file) removes the directories it created with the socket.
func TestBadStartCreatesNoDirectories(t *testing.T) {
	dir := t.TempDir()
	notADir := filepath.Join(dir, "a-file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"missing key file", []string{"--mode=controller", "--rds-address=127.0.0.1", "--publish=false",
			"--rds-key-file=" + filepath.Join(dir, "missing")}},
		{"node identity unusable", []string{"--mode=node", "--node-id=n1", "--rds-name=rds1",
			"--node-nvme-dir=" + filepath.Join(notADir, "nvme")}},
	} {
		sub := filepath.Join(dir, "sub")
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append(tc.args, "--endpoint=unix://"+filepath.Join(sub, "dir", "csi.sock")), &stdout, &stderr)
		if code != 1 {
			t.Errorf("%s: exit %d (%s), want 1", tc.name, code, stderr.String())
		}
		if _, err := os.Stat(sub); err == nil {
			t.Errorf("%s: exit %d (%s) but %s was left behind", tc.name, code, stderr.String(), sub)
		}
	}
}
