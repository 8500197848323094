package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"golang.org/x/crypto/ssh"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/flagonce"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// startSimulatorServer is startSimulator with the simulator itself, for
// tests that look at what reached it.
func startSimulatorServer(t *testing.T, dir string) (sim *rdssim.Server, host, port, keyFile, knownHosts string) {
	t.Helper()
	keyFile = filepath.Join(dir, "id_ed25519")
	pub, err := rdssim.WriteClientKey(keyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	sim, err = rdssim.New(rdssim.Config{DataDir: filepath.Join(dir, "pool"), AuthorizedKeys: []ssh.PublicKey{pub}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	addr, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	knownHosts = filepath.Join(dir, "known_hosts")
	if err := sim.WriteKnownHosts(knownHosts); err != nil {
		t.Fatal(err)
	}
	host, port, _ = strings.Cut(addr, ":")
	return sim, host, port, keyFile, knownHosts
}

// Flags that were taken and then quietly did something else: a float
// that is not a number (NaN compares false, so --fence-guard-share=NaN
// passed its range check and turned the mass-outage guard off), a
// duration below the floor its meaning needs, a flag of the other mode,
// a relative directory, a socket path the kernel cannot bind. Each exits
// 2 with one line naming the flag, and nothing is written (the socket's
// directory, the node's NVMe identity) and nothing reaches the RDS.
func TestFlagsTakenAndQuietlyWrongRefused(t *testing.T) {
	dir := t.TempDir()
	sim, host, port, keyFile, knownHosts := startSimulatorServer(t, dir)
	controller := []string{"--mode=controller", "--rds-address=" + host, "--rds-port=" + port,
		"--rds-key-file=" + keyFile, "--rds-known-hosts-file=" + knownHosts, "--kubeconfig=" + writeKubeconfig(t, dir)}
	nvmeDir := filepath.Join(dir, "nvme")
	node := []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-nvme-dir=" + nvmeDir}
	loop := []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-connector=loop", "--node-loop-data-dir=" + filepath.Join(dir, "pool")}
	longDir := filepath.Join(dir, strings.Repeat("d", 120-len(dir)))
	trailDir := filepath.Join(dir, "trail")
	for i, tc := range []struct {
		base []string
		args string
		want string
	}{
		{controller, "--fence-guard-share=NaN", "--fence-guard-share must be a number in (0, 1] (have NaN)"},
		{controller, "--fence-guard-share=-Inf", "--fence-guard-share must be a number in (0, 1]"},
		{controller, "--fence-guard-share=+Inf", "--fence-guard-share must be a number in (0, 1]"},
		{controller, "--storage-fencing=allow-host --fence-guard-share=nan", "--fence-guard-share must be a number in (0, 1] (have NaN)"},
		{controller, "--not-ready-threshold=0 --fence-guard-share=0.3", "--fence-guard-share needs a positive --not-ready-threshold or --heartbeat-threshold"},
		{controller, "--storage-fencing=allow-host --not-ready-threshold=0 --heartbeat-threshold=0 --fence-guard-share=0.3", "--fence-guard-share needs a positive --not-ready-threshold or --heartbeat-threshold"},
		{controller, "--not-ready-threshold=1ns", "--not-ready-threshold=1ns is shorter than 5s"},
		{controller, "--orphaned-claim-threshold=1ns", "--orphaned-claim-threshold=1ns is shorter than 1m0s"},
		{controller, "--migration-timeout=1ns", "--migration-timeout=1ns is shorter than 10s"},
		{controller, "--watch-disconnect-threshold=1ns", "--watch-disconnect-threshold=1ns is shorter than 5s"},
		{controller, "--fence-call-timeout=1ns", "--fence-call-timeout=1ns is shorter than 1s"},
		{controller, "--shutdown-grace=1ns", "--shutdown-grace=1ns is outside 1s..10m0s"},
		{controller, "--leader-election --leader-election-retry-period=1ms --leader-election-renew-deadline=3ms --leader-election-lease-duration=4ms", "--leader-election-retry-period=1ms is shorter than 1s"},
		{controller, "--leader-election --leader-election-retry-period=9s", "--leader-election-renew-deadline above 1.2 times --leader-election-retry-period"},
		{controller, "--leader-election --leader-election-lease-duration=15500ms", "--leader-election-lease-duration=15.5s must be whole seconds"},
		{controller, "--rds-login-options=c+t", `--rds-login-options: invalid argument: login options "c+t" must be RouterOS console options`},
		{controller, "--node-nvme-dir=/etc/nvme", "--node-nvme-dir is a flag of the node plugin"},
		{controller, "--max-volumes-per-node=8", "--max-volumes-per-node is a flag of the node plugin"},
		{controller, "--node-state-dir=/var/lib/rds-csi", "--node-state-dir is a flag of the node plugin"},
		{controller, "--node-connector=tcp", "--node-connector is a flag of the node plugin"},
		{controller, "--endpoint=unix://" + longDir + "/csi.sock", "too long for a unix socket: at most 107 bytes"},
		{node, "--copy-from-data=unsupported", "--copy-from-data is a flag of the controller"},
		{node, "--orphaned-claim-threshold=10m", "--orphaned-claim-threshold is a flag of the controller"},
		{node, "--storage-fencing=allow-host", "--storage-fencing is a flag of the controller"},
		{node, "--publish=false", "--publish is a flag of the controller"},
		{node, "--rds-pool=pool2", "--rds-pool is a flag of the controller"},
		{node, "--kubeconfig=" + filepath.Join(dir, "kubeconfig"), "--kubeconfig is a flag of the controller"},
		{node, "--fence-guard-share=0.5", "--fence-guard-share is a flag of the controller"},
		{node, "--rds-key-file=" + keyFile, "--rds-key-file is a flag of the controller"},
		{node, "--endpoint=unix://" + longDir + "/csi.sock", "too long for a unix socket: at most 107 bytes"},
		{node, "--endpoint=unix://" + trailDir + "/", "names a directory (it ends in /, /. or /..); name the socket file in it, for example " + trailDir + "/csi.sock"},
		{controller, "--endpoint=unix://" + trailDir + "/.", "names a directory (it ends in /, /. or /..); name the socket file in it, for example " + trailDir + "/csi.sock"},
		{node, "--endpoint=unix://" + trailDir + "/sub/..", "names a directory (it ends in /, /. or /..); name the socket file in it, for example " + trailDir + "/csi.sock"},
		{loop[:4], "--node-loop-data-dir=rds-pool", `--node-loop-data-dir "rds-pool" must be an absolute path`},
		{loop, "--rds-user=admin", "--rds-user is a flag of the controller"},
	} {
		socketDir := filepath.Join(dir, fmt.Sprintf("sock-%d", i))
		endpoint := "unix://" + filepath.Join(socketDir, "csi.sock")
		args := flagonce.Replace(append([]string{"--endpoint=" + endpoint}, tc.base...), strings.Fields(tc.args))
		code, serving, out := startOrExit(t, args, endpoint)
		if serving || code != 2 || !strings.Contains(out, tc.want) || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("%s: serving %v, exit %d, stderr %q; want exit 2 and one line saying %q", tc.args, serving, code, out, tc.want)
		}
		for _, p := range []string{socketDir, longDir, nvmeDir, trailDir} {
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s: %s was created before the flag error: %v", tc.args, p, err)
			}
		}
	}
	if st := sim.Stats(); st.Accepted != 0 {
		t.Errorf("the flag errors made %d connections to the RDS, want none", st.Accepted)
	}
	// The same flags with their own mode are taken: the loop connector
	// reads the RDS's layout, --node-lease reads --kubeconfig (and stops
	// at the API it cannot reach here).
	var stdout, stderr bytes.Buffer
	args := append(append([]string{"--endpoint=unix://" + filepath.Join(dir, "ok.sock")}, loop...), "--rds-pool=storage-pool", "--rds-volume-path=/storage-pool/kubernetes-volumes",
		"--node-lease", "--node-lease-namespace=rds-csi", "--kubeconfig="+filepath.Join(dir, "no-kubeconfig"))
	if code := run(context.Background(), args, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "--node-lease needs the Kubernetes API") {
		t.Errorf("the loop connector's layout flags and --node-lease's --kubeconfig: exit %d, %q; want them taken (exit 1 at the Kubernetes API)", code, stderr.String())
	}
}

// --rds-key-file given the .pub beside the key says so, whether the key
// is read first for the RDS client or for the attachment key (storage
// fencing), and the driver never derives an attachment key from a public
// key.
func TestPublicKeyForThePrivateKeyRefused(t *testing.T) {
	dir := t.TempDir()
	sim, host, port, keyFile, knownHosts := startSimulatorServer(t, dir)
	pub := keyFile + ".pub"
	if err := os.WriteFile(pub, []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHTbc1Zrh6kAe7lrHUGeo2DOLNNd1G7eu6k8yHkJfwXm test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, extra := range [][]string{{"--publish=false"}, {"--storage-fencing=allow-host", "--kubeconfig=" + writeKubeconfig(t, dir)}} {
		args := append([]string{"--mode=controller", "--endpoint=unix://" + filepath.Join(dir, fmt.Sprintf("csi-%d.sock", i)), "--rds-address=" + host, "--rds-port=" + port,
			"--rds-key-file=" + pub, "--rds-known-hosts-file=" + knownHosts}, extra...)
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), args, &stdout, &stderr)
		out := stderr.String()
		if code != 1 || !strings.Contains(out, "is a public key; the private key is wanted ("+keyFile+",") || strings.Contains(out, "readable by others") {
			t.Errorf("%v: exit %d, %q; want it to say the key is a public key and name the private one", extra, code, out)
		}
	}
	if st := sim.Stats(); st.Accepted != 0 {
		t.Errorf("%d connections to the RDS with a public key for the private one", st.Accepted)
	}
}

// The controller pointed at an RDS that does not answer says so at
// start, once, with the address, before anyone asks /readyz or Probe.
func TestUnreachableRDSLoggedAtStart(t *testing.T) {
	dir := t.TempDir()
	sim, host, port, keyFile, knownHosts := startSimulatorServer(t, dir)
	sim.Close() // the address is pinned, and nobody answers there
	lines := make(chan string, 100)
	logger := funcr.New(func(prefix, args string) { lines <- prefix + " " + args }, funcr.Options{})
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()
	args := []string{"--mode=controller", "--endpoint=unix://" + filepath.Join(dir, "csi.sock"), "--rds-address=" + host, "--rds-port=" + port,
		"--rds-key-file=" + keyFile, "--rds-known-hosts-file=" + knownHosts, "--publish=false", "--rds-command-timeout=2s"}
	exit := make(chan int, 1)
	var stdout, stderr bytes.Buffer
	go func() { exit <- run(ctx, args, &stdout, &stderr) }()
	const want = `"the RDS does not answer`
	var said []string
	bound := time.After(2 * time.Minute) // a bound on a hang, not a timing: the probe's retries end long before
	for len(said) == 0 {
		select {
		case l := <-lines:
			if strings.Contains(l, want) {
				said = append(said, l)
			}
		case code := <-exit:
			t.Fatalf("the driver exited (%d) without logging that the RDS does not answer: %s", code, stderr.String())
		case <-bound:
			t.Fatal("no log line saying the RDS does not answer")
		}
	}
	cancel()
	<-exit
	close(lines)
	for l := range lines {
		if strings.Contains(l, want) {
			said = append(said, l)
		}
	}
	if len(said) != 1 {
		t.Fatalf("the log says %d times that the RDS does not answer, want once: %q", len(said), said)
	}
	if !strings.Contains(said[0], `"address"="`+host+":"+port+`"`) {
		t.Errorf("the log line does not name the address %s:%s: %s", host, port, said[0])
	}
}
