//go:build review25b

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
	"golang.org/x/crypto/ssh"
)

// HOLE (a second start with a bad flag takes a running driver off its socket:
// kubelet and the sidecars can no longer reach the live driver until it
// restarts): csi.Listen removes whatever socket is at --endpoint, live or
// stale, binds its own, and the configuration errors checked after it (an
// unreadable --rds-key-file, the kubeconfig, the storage-fencing key, the node
// identity) then close that listener, unlinking the path. Input, with a driver
// already serving on /csi/csi.sock:
//
//	rds-csi-driver --mode controller --rds-address 127.0.0.1 --publish=false \
//	  --endpoint unix:///csi/csi.sock --rds-key-file /nonexistent
//
// exits 1 ("reading SSH key") and /csi/csi.sock is gone. It should refuse a
// socket someone is listening on (dial it first) or check every flag and file
// before it touches the endpoint.
func TestReview25bBadStartKeepsALiveSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	live, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--mode=controller", "--rds-address=127.0.0.1", "--publish=false",
		"--endpoint=unix://" + sock, "--rds-key-file=" + filepath.Join(dir, "missing")}, &stdout, &stderr)
	if code == 0 {
		t.Fatalf("started with a missing key file: %s", stderr.String())
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("exit %d (%s): the live driver's socket %s is gone: %v", code, stderr.String(), sock, err)
	}
	if c, err := net.Dial("unix", sock); err != nil {
		t.Errorf("the live driver is unreachable after a failed second start: %v", err)
	} else {
		c.Close()
	}
}

// HOLE (directories created by a start that then fails on a bad flag): the
// socket's parent directories are created before the RDS key is read.
// Input: rds-csi-driver --mode controller --rds-address 127.0.0.1
// --publish=false --endpoint unix:///tmp/x/sub/dir/csi.sock
// --rds-key-file /nonexistent: exit 1, /tmp/x/sub/dir left behind.
func TestReview25bBadStartCreatesNoDirectories(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"--mode=controller", "--rds-address=127.0.0.1", "--publish=false",
		"--endpoint=unix://" + filepath.Join(sub, "dir", "csi.sock"), "--rds-key-file=" + filepath.Join(dir, "missing")}, &stdout, &stderr)
	if code == 0 {
		t.Fatalf("started with a missing key file")
	}
	if _, err := os.Stat(sub); err == nil {
		t.Errorf("exit %d (%s) but %s was created", code, stderr.String(), sub)
	}
}

// HOLE (one class of error, two exit statuses; docs/attachments.md says
// "a flag error is one line on stderr and exit status 1", which is untrue for
// a malformed value): a value the flag package cannot parse exits 2, a value
// the driver's checks refuse exits 1, and a stray argument exits 1. Inputs:
//
//	rds-csi-driver --mode controller --rds-address x --rds-port abc   -> exit 2
//	rds-csi-driver --mode controller --rds-address x --rds-port 0     -> exit 1
//	rds-csi-driver --mode foo --rds-address x                         -> exit 1
//	rds-csi-driver --rds-address x stray                              -> exit 1
//
// Usage errors (a bad flag, value or argument; nothing done) should all exit
// 2, as rdsctl's and kubectl rds's do, and the docs say so.
func TestReview25bFlagErrorsShareOneExitStatus(t *testing.T) {
	for _, args := range [][]string{
		{"--mode=controller", "--rds-address=x", "--rds-port=abc"},
		{"--mode=controller", "--rds-address=x", "--rds-port=0"},
		{"--mode=foo", "--rds-address=x"},
		{"--mode=controller", "--rds-address=x", "stray"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 2 {
			t.Errorf("rds-csi-driver %q: exit %d (%s), want 2 (a usage error)", args, code, stderr.String())
		}
	}
}

// HOLE (every CreateVolume fails, far from the flag, on a driver that started
// fine): --nqn-prefix is checked by forming prefix+"x" only, so a prefix that
// leaves no room under the 223-byte NQN limit for a volume ID (the
// provisioner's pvc-<uuid> is 40 bytes; a slot may be 64) is accepted. Input:
//
//	rds-csi-driver --mode node --node-id n1 --rds-name rds1 \
//	  --nqn-prefix nqn.2000-02.com.mikrotik:<180 x 'a'>
//
// serves. It should refuse the prefix at start, naming --nqn-prefix and the
// room it leaves.
func TestReview25bNQNPrefixLeavesRoomForAVolumeID(t *testing.T) {
	args, endpoint := nodeArgs(t.TempDir(), 0)
	args = append(args, "--nqn-prefix=nqn.2000-02.com.mikrotik:"+strings.Repeat("a", 180))
	code, serving, stderr := startOrExit(t, args, endpoint)
	if serving || code == 0 || !strings.Contains(stderr, "--nqn-prefix") {
		t.Errorf("exit %d, serving %v, stderr %q: a prefix no volume NQN fits under was accepted", code, serving, stderr)
	}
}

// HOLE (a setting silently ignored: the operator believes it is in force):
// flags documented as "with --storage-fencing=allow-host" or as leader
// election's are taken and ignored without them, although the driver refuses
// --heartbeat-threshold and --out-of-service-taint without storage fencing.
// Inputs (each serves):
//
//	rds-csi-driver --mode controller ... --attachment-key-file /nonexistent
//	rds-csi-driver --mode controller ... --leader-election-lease-duration 1s
//
// (the second with --leader-election is refused: lease-duration must exceed
// renew-deadline). Each should be refused naming the flag it needs.
func TestReview25bFlagsWithoutTheirFeatureRefused(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	pub, err := rdssim.WriteClientKey(keyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := rdssim.New(rdssim.Config{DataDir: filepath.Join(dir, "pool"), AuthorizedKeys: []ssh.PublicKey{pub}})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	addr, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	knownHosts := filepath.Join(dir, "known_hosts")
	if err := sim.WriteKnownHosts(knownHosts); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	for i, extra := range []struct{ flag, arg string }{
		{"--attachment-key-file", "--attachment-key-file=" + filepath.Join(dir, "missing")},
		{"--leader-election-lease-duration", "--leader-election-lease-duration=1s"},
	} {
		endpoint := "unix://" + filepath.Join(dir, fmt.Sprintf("csi-%d.sock", i))
		args := []string{"--mode=controller", "--endpoint=" + endpoint, "--rds-address=" + host, "--rds-port=" + port,
			"--rds-key-file=" + keyFile, "--rds-known-hosts-file=" + knownHosts, "--publish=false", extra.arg}
		code, serving, stderr := startOrExit(t, args, endpoint)
		if serving || code == 0 || !strings.Contains(stderr, extra.flag) {
			t.Errorf("%s: exit %d, serving %v, stderr %q: the flag was taken and ignored", extra.arg, code, serving, stderr)
		}
	}
}
