package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/crypto/ssh"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/srvlab/rds-csi/pkg/flagonce"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

func TestConfigErrorIsOneLine(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		code int // 2: a usage error, 1: a file the flags name
		want []string
	}{
		{"no RDS address", []string{"--mode=controller", "--endpoint=unix://" + dir + "/csi.sock"}, 2, []string{"--rds-address is required"}},
		{"bad mode and port", []string{"--mode=both", "--nvme-port=0", "--rds-address=10.0.0.1"}, 2, []string{"--mode must be controller, node or all, not \"both\""}},
		{"unknown mode, no node ID", []string{"--mode=foo", "--rds-address=x"}, 2, []string{"--mode must be controller, node or all, not \"foo\""}},
		{"bad port in node mode", []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--nvme-port=0"}, 2, []string{"--nvme-port"}},
		{"IPv6 RDS without a name", []string{"--mode=controller", "--rds-address=fd00::1"}, 2, []string{"--rds-name is required"}},
		{"node mode without node ID", []string{"--mode=node", "--rds-name=rds1"}, 2, []string{"--node-id is required in node mode"}},
		{"node mode without RDS name", []string{"--mode=node", "--node-id=n1"}, 2, []string{"--rds-name (or --rds-address) is required in node mode"}},
		{"node mode with a bad RDS name", []string{"--mode=node", "--node-id=n1", "--rds-name=rds 1"}, 2, []string{"--rds-name \"rds 1\" must be a Kubernetes label value"}},
		{"node mode with a bad NQN prefix", []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--nqn-prefix=mikrotik:"}, 2, []string{"--nqn-prefix"}},
		{"node mode with a relative state directory", []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-state-dir=state"}, 2, []string{"--node-state-dir \"state\" must be an absolute path"}},
		{"node mode on a tcp endpoint without a state directory", []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--endpoint=tcp://127.0.0.1:10000"}, 2, []string{"--node-state-dir is required with a tcp:// --endpoint"}},
		{"missing key file", []string{"--mode=controller", "--publish=false", "--rds-address=10.0.0.1", "--rds-key-file=" + dir + "/nope", "--rds-known-hosts-file=" + dir + "/kh"}, 1, []string{"RDS client", "nope"}},
		{"bad storage fencing", []string{"--mode=controller", "--rds-address=10.0.0.1", "--storage-fencing=on"}, 2, []string{"--storage-fencing must be off or allow-host"}},
		{"taint without storage fencing", []string{"--mode=controller", "--rds-address=10.0.0.1", "--not-ready-threshold=30s", "--out-of-service-taint"}, 2, []string{"--out-of-service-taint needs --storage-fencing=allow-host"}},
		{"taint with fencing but threshold 0", []string{"--mode=controller", "--rds-address=10.0.0.1", "--storage-fencing=allow-host", "--not-ready-threshold=0", "--heartbeat-threshold=0", "--out-of-service-taint"}, 2, []string{"a positive --not-ready-threshold"}},
		{"stray argument", []string{"--mode=controller", "extra"}, 2, []string{"unexpected arguments"}},
		{"RDS command timeout too short", []string{"--mode=controller", "--rds-address=10.0.0.1", "--rds-command-timeout=500ms"}, 2, []string{"--rds-command-timeout=500ms is outside 1s..10m0s"}},
		{"RDS command timeout of hours", []string{"--mode=controller", "--rds-address=10.0.0.1", "--rds-command-timeout=1h"}, 2, []string{"--rds-command-timeout=1h0m0s is outside"}},
		{"leader election timings", []string{"--mode=controller", "--rds-address=10.0.0.1", "--leader-election", "--leader-election-lease-duration=5s", "--leader-election-renew-deadline=10s"}, 2, []string{"lease-duration > renew-deadline"}},
		{"export auth without storage fencing", []string{"--mode=controller", "--rds-address=10.0.0.1", "--export-auth=dhchap"}, 2, []string{"--export-auth=dhchap needs --storage-fencing=allow-host"}},
		{"bad export auth", []string{"--mode=controller", "--rds-address=10.0.0.1", "--storage-fencing=allow-host", "--export-auth=yes"}, 2, []string{"--export-auth must be off or dhchap, not \"yes\""}},
		{"export auth, no attachment key", []string{"--mode=controller", "--rds-address=10.0.0.1", "--storage-fencing=allow-host", "--export-auth=dhchap", "--kubeconfig=" + writeKubeconfig(t, dir), "--attachment-key-file=" + dir + "/no-key", "--rds-known-hosts-file=" + dir + "/kh"}, 1, []string{"reading the attachment key", "no-key"}},
		{"no Kubernetes API", []string{"--mode=controller", "--rds-address=10.0.0.1", "--rds-key-file=" + dir + "/key", "--rds-known-hosts-file=" + dir + "/kh", "--kubeconfig=" + dir + "/nope"}, 1, []string{"needs the Kubernetes API"}},
	}
	for _, tc := range tests {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stdout, &stderr)
		out := stderr.String()
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d (stderr %q)", tc.name, code, tc.code, out)
		}
		if strings.Count(strings.TrimSpace(out), "\n") != 0 || !strings.HasPrefix(out, "rds-csi-driver: ") {
			t.Errorf("%s: stderr is not one line: %q", tc.name, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: %q does not mention %q", tc.name, out, w)
			}
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"--version"}, &stdout, &stderr); code != 0 || strings.TrimSpace(stdout.String()) == "" {
		t.Errorf("--version: exit %d, %q", code, stdout.String())
	}
}

// writeKubeconfig writes a kubeconfig that parses (nothing is dialled
// before the flags and files are checked) and returns its path.
func writeKubeconfig(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n"
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startSimulator runs the RDS simulator in dir until the test ends, with
// a client key it accepts and a known_hosts file pinning its host key.
func startSimulator(t *testing.T, dir string) (host, port, keyFile, knownHosts string) {
	t.Helper()
	keyFile = filepath.Join(dir, "id_ed25519")
	pub, err := rdssim.WriteClientKey(keyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := rdssim.New(rdssim.Config{DataDir: filepath.Join(dir, "pool"), AuthorizedKeys: []ssh.PublicKey{pub}})
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
	host, port, _ = net.SplitHostPort(addr)
	return host, port, keyFile, knownHosts
}

// TestServeAndGracefulStop runs the binary's main path against the
// simulator: flags, key and known_hosts files, the socket, a real call,
// then the context that SIGTERM cancels.
func TestServeAndGracefulStop(t *testing.T) {
	dir := t.TempDir()
	host, port, keyFile, knownHosts := startSimulator(t, dir)
	endpoint := "unix://" + filepath.Join(dir, "csi.sock")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"--mode=controller", "--endpoint=" + endpoint, "--rds-address=" + host, "--rds-port=" + port,
			"--rds-key-file=" + keyFile, "--rds-known-hosts-file=" + knownHosts, "--shutdown-grace=5s", "--publish=false"}, &stdout, &stderr)
	}()

	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// WaitForReady blocks until the server listens, so no polling is needed.
	probe, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true))
	if err != nil || !probe.GetReady().GetValue() {
		t.Fatalf("Probe: %v %v", probe, err)
	}
	vol, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789",
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		}},
	})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	if vol.Volume.VolumeContext["nvmeAddress"] != host {
		t.Errorf("volume context %v, want the RDS address as NVMe address", vol.Volume.VolumeContext)
	}
	cancel() // what SIGTERM does
	if code := <-exit; code != 0 {
		t.Errorf("exit %d after graceful stop; stderr %s", code, stderr.String())
	}
}

// TestServeNodeMode runs the binary as the node plugin: no RDS
// credentials, the Identity and Node services on the socket, no
// Controller service, the node's topology names the RDS, and its node ID
// carries the host NQN from --node-nvme-dir (the host's /etc/nvme).
func TestServeNodeMode(t *testing.T) {
	dir := t.TempDir()
	endpoint := "unix://" + filepath.Join(dir, "csi.sock")
	const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:0f6c2d1e-8a7b-4c3d-9e0f-1a2b3c4d5e6f"
	if err := os.WriteFile(filepath.Join(dir, "hostnqn"), []byte(hostNQN+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"--mode=node", "--endpoint=" + endpoint, "--node-id=worker-1", "--rds-name=rds1",
			"--max-volumes-per-node=20", "--node-nvme-dir=" + dir}, &stdout, &stderr)
	}()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ident := csi.NewIdentityClient(conn)
	probe, err := ident.Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true))
	if err != nil || !probe.GetReady().GetValue() {
		t.Fatalf("Probe: %v %v", probe, err)
	}
	caps, err := ident.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range caps.Capabilities {
		if c.GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE {
			t.Error("node mode advertises the controller service")
		}
	}
	info, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatalf("NodeGetInfo: %v", err)
	}
	if info.NodeId != "worker-1" || info.MaxVolumesPerNode != 20 || info.AccessibleTopology.GetSegments()["topology.rds.csi.srvlab.io/rds"] != "rds1" {
		t.Errorf("NodeGetInfo: %v", info)
	}
	nodeCaps, err := csi.NewNodeClient(conn).NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil || len(nodeCaps.Capabilities) == 0 {
		t.Errorf("NodeGetCapabilities: %v %v", nodeCaps, err)
	}
	if _, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "x"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("CreateVolume on a node plugin: %v, want Unimplemented", err)
	}
	cancel()
	if code := <-exit; code != 0 {
		t.Errorf("exit %d after graceful stop; stderr %s", code, stderr.String())
	}
}

// startOrExit runs the driver until it either exits (its status) or
// serves Probe on endpoint (serving): a flag error must be the former.
func startOrExit(t *testing.T, args []string, endpoint string) (code int, serving bool, stderr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var errOut bytes.Buffer
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, args, io.Discard, &errOut) }()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	probed := make(chan struct{})
	go func() {
		// WaitForReady: returns once the driver serves, or when ctx ends.
		if _, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true)); err == nil {
			close(probed)
		}
	}()
	select {
	case code = <-exit:
	case <-probed:
		serving = true
		cancel()
		code = <-exit
	}
	cancel()
	return code, serving, errOut.String()
}

// Every flag error stops the driver with one line before it touches the
// host: the node's --node-nvme-dir (the host's /etc/nvme) is not created,
// whatever flag is wrong, and a bad --http-endpoint is a flag error.
func TestFlagErrorsStopBeforeTheHost(t *testing.T) {
	dir := t.TempDir()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	socketParent := filepath.Join(dir, "a-file")
	if err := os.WriteFile(socketParent, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
		code int // 2: a usage error, 1: the address cannot be listened on
	}{
		{"unparsable --http-endpoint", []string{"--http-endpoint=localhost"}, "--http-endpoint", 2},
		{"--http-endpoint port out of range", []string{"--http-endpoint=127.0.0.1:99999"}, "--http-endpoint", 2},
		{"--http-endpoint port 0", []string{"--http-endpoint=127.0.0.1:0"}, "--http-endpoint", 2},
		{"--http-endpoint in use", []string{"--http-endpoint=" + busy.Addr().String()}, "--http-endpoint", 1},
		{"tcp endpoint port out of range", []string{"--endpoint=tcp://127.0.0.1:70000"}, "--endpoint", 2},
		{"unix endpoint that cannot be created", []string{"--endpoint=unix://" + socketParent + "/csi.sock"}, "listening on", 1},
		{"zero --shutdown-grace", []string{"--shutdown-grace=0"}, "--shutdown-grace", 2},
		{"hours of --shutdown-grace", []string{"--shutdown-grace=2h"}, "--shutdown-grace", 2},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nvmeDir := filepath.Join(dir, fmt.Sprintf("nvme-%d", i))
			endpoint := "unix://" + filepath.Join(dir, fmt.Sprintf("csi-%d.sock", i))
			args := flagonce.Replace([]string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-nvme-dir=" + nvmeDir, "--endpoint=" + endpoint}, tc.args)
			code, serving, stderr := startOrExit(t, args, endpoint)
			if serving || code != tc.code {
				t.Errorf("serving %v, exit %d, want %d: %s", serving, code, tc.code, stderr)
			}
			if !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("stderr %q: not one line naming %s", stderr, tc.want)
			}
			if _, err := os.Stat(nvmeDir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the host's NVMe identity was touched before the flag error: %v", err)
			}
		})
	}
}

// Flags of the controller that combine badly or are out of range.
//
// --nvme-address and --rds-address are a host alone: a port or a space in
// one stops the controller with a message naming the flag and its port
// flag, instead of an nvme connect error on every node at NodeStage (the
// controller hands --nvme-address to the nodes) or a name lookup failure.
func TestControllerFlagRanges(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	if _, err := rdssim.WriteClientKey(keyFile, ""); err != nil {
		t.Fatal(err)
	}
	base := []string{"--mode=controller", "--rds-address=127.0.0.1", "--rds-key-file=" + keyFile, "--rds-insecure-skip-host-key-check"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"allow-host without publish", []string{"--publish=false", "--storage-fencing=allow-host"}, "--storage-fencing=allow-host needs --publish: with allow-host a volume's export is opened only by ControllerPublish"},
		{"RDS port 0", []string{"--publish=false", "--rds-port=0"}, "--rds-port"},
		{"RDS port 70000", []string{"--publish=false", "--rds-port=70000"}, "--rds-port"},
		{"negative attach grace period", []string{"--publish=false", "--attach-grace-period=-1s"}, "--attach-grace-period"},
		{"leader election in a namespace that cannot exist", []string{"--publish=false", "--leader-election", "--leader-election-namespace=Kube System"}, `--leader-election-namespace "Kube System" is not a namespace name`},
		{"NVMe address with a port", []string{"--publish=false", "--nvme-address=10.0.0.1:4420"}, `--nvme-address: invalid argument: address "10.0.0.1:4420" has a port (4420)`},
		{"NVMe address with a space", []string{"--publish=false", "--nvme-address=rds 1"}, `--nvme-address: invalid argument: address "rds 1" is not a host name`},
		{"NVMe address in brackets", []string{"--publish=false", "--nvme-address=[fd00::1]"}, "without brackets"},
		{"RDS address with a port", []string{"--publish=false", "--rds-name=rds1", "--rds-address=10.0.0.1:22"}, "the port is --rds-port"},
		{"RDS address with a space", []string{"--publish=false", "--rds-name=rds1", "--rds-address=rds 1"}, `--rds-address: invalid argument: address "rds 1"`},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			endpoint := "unix://" + filepath.Join(dir, fmt.Sprintf("csi-%d.sock", i))
			code, serving, stderr := startOrExit(t, flagonce.Replace(append([]string{"--endpoint=" + endpoint}, base...), tc.args), endpoint)
			if serving || code != 2 {
				t.Errorf("serving %v, exit %d, want a flag error (exit 2): %s", serving, code, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q does not name %s", stderr, tc.want)
			}
		})
	}
}

// nodeArgs are the flags of a node plugin that serves, in dir.
func nodeArgs(dir string, i int) (args []string, endpoint string) {
	endpoint = "unix://" + filepath.Join(dir, fmt.Sprintf("csi-%d.sock", i))
	return []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-nvme-dir=" + filepath.Join(dir, "nvme"), "--endpoint=" + endpoint}, endpoint
}

// --driver-name is validated as CSI requires (at most 63 characters,
// domain name notation) at start: a bad one would otherwise fail far from
// the flag, at the kubelet's registration and every CSIDriver and
// StorageClass naming it.
func TestDriverNameValidated(t *testing.T) {
	dir := t.TempDir()
	for i, name := range []string{"rds csi!", "-rds.csi", strings.Repeat("a", 64) + ".srvlab.io", "RDS.csi.srvlab.io", "rds.csi.", ""} {
		args, endpoint := nodeArgs(dir, i)
		code, serving, stderr := startOrExit(t, append(args, "--driver-name="+name), endpoint)
		if serving || code != 2 || !strings.Contains(stderr, "--driver-name") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("--driver-name=%q: serving %v, exit %d, stderr %q: want a one-line flag error naming --driver-name", name, serving, code, stderr)
		}
	}
	// 63 characters is the limit, not past it.
	args, endpoint := nodeArgs(dir, 99)
	name := strings.Repeat("a", 52) + ".srvlab.io"
	if code, serving, stderr := startOrExit(t, append(args, "--driver-name="+name), endpoint); !serving || code != 0 {
		t.Errorf("--driver-name=%q (%d characters): serving %v, exit %d, stderr %q", name, len(name), serving, code, stderr)
	}
}

// --node-id is validated with the other flags, before the node service
// settles the host's NVMe identity: a bad one leaves no hostnqn behind
// and is blamed on the flag, not on the file or the mount.
func TestNodeIDValidatedBeforeTheHost(t *testing.T) {
	for i, id := range []string{"n 1", "a/b", "UPPER_case", "n1/nqn.2014-08.org.nvmexpress:uuid:a"} {
		dir := t.TempDir()
		nvmeDir := filepath.Join(dir, "nvme")
		endpoint := "unix://" + filepath.Join(dir, fmt.Sprintf("csi-%d.sock", i))
		args := []string{"--mode=node", "--node-id=" + id, "--rds-name=rds1", "--node-nvme-dir=" + nvmeDir, "--endpoint=" + endpoint}
		code, serving, stderr := startOrExit(t, args, endpoint)
		if serving || code != 2 || !strings.Contains(stderr, "--node-id") || strings.Contains(stderr, "fix the file or the mount") {
			t.Errorf("--node-id=%q: serving %v, exit %d, stderr %q: want a flag error naming --node-id, not the mount", id, serving, code, stderr)
		}
		if _, err := os.Stat(nvmeDir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("--node-id=%q: the host's NVMe identity (%s) was touched before the node ID was refused: %v", id, nvmeDir, err)
		}
	}
}

// A relative --node-nvme-dir would be the container's directory, not the
// host's /etc/nvme that the DaemonSet mounts: a new host identity at every
// restart. It is refused, and nothing is created under the working
// directory.
func TestRelativeNVMeDirRefused(t *testing.T) {
	wd := t.TempDir()
	t.Chdir(wd)
	endpoint := "unix://" + filepath.Join(wd, "csi.sock")
	args := []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-nvme-dir=etc/nvme", "--endpoint=" + endpoint}
	code, serving, stderr := startOrExit(t, args, endpoint)
	if serving || code != 2 || !strings.Contains(stderr, "--node-nvme-dir") || !strings.Contains(stderr, "absolute") {
		t.Errorf("relative --node-nvme-dir: serving %v, exit %d, stderr %q: want a flag error", serving, code, stderr)
	}
	if _, err := os.Stat(filepath.Join(wd, "etc")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a relative --node-nvme-dir created a host identity under the working directory: %v", err)
	}
}

// A flag given twice (--mode=all --mode=node, say a chart's own flag and
// an extra argument) is refused with one line naming both values, not
// silently last-wins; every flag is given once, klog's too.
func TestRepeatedFlagRefused(t *testing.T) {
	dir := t.TempDir()
	for i, tc := range [][]string{
		{"--mode=all", "--mode=node"},
		{"--node-id=n2"},
		{"--v=2", "-v", "4"},
		{"--shutdown-grace=5s", "--shutdown-grace=5s"},
	} {
		args, endpoint := nodeArgs(dir, i)
		code, serving, stderr := startOrExit(t, append(args, tc...), endpoint)
		if serving || code != 2 || !strings.Contains(stderr, "is given more than once") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("%q: serving %v, exit %d, stderr %q: want a one-line refusal (exit 2)", tc, serving, code, stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "nvme")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused command line touched the host's NVMe identity: %v", err)
	}
}

// A flag the driver does not know is one line too (not the whole usage in
// the pod's log); -h prints the usage and exits 0.
func TestFlagErrorsAndHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"--mode=node", "--colour"}, &stdout, &stderr); code != 2 ||
		strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 || !strings.Contains(stderr.String(), "-colour") {
		t.Errorf("unknown flag: exit %d, stderr %q: want one line naming it, exit 2", code, stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := run(context.Background(), []string{"-h"}, &stdout, &stderr); code != 0 ||
		!strings.Contains(stdout.String(), "-node-nvme-dir string") || stderr.Len() != 0 {
		t.Errorf("-h: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

// Every usage error exits 2, one class of error with one exit status: a
// value the flag package cannot parse, a value the driver's checks refuse
// and a stray argument alike; --mode foo names the unknown mode, not a
// missing --node-id.
func TestFlagErrorsShareOneExitStatus(t *testing.T) {
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
		if args[0] == "--mode=foo" && (!strings.Contains(stderr.String(), `--mode must be controller, node or all, not "foo"`) || strings.Contains(stderr.String(), "--node-id")) {
			t.Errorf("rds-csi-driver %q: %q: want the unknown mode named, and only it", args, stderr.String())
		}
	}
}

// --nqn-prefix leaves room under the 223-byte NQN limit for a volume ID
// (the provisioner's pvc-<uuid>, 40 bytes): checked by forming prefix+"x"
// only, a longer prefix would be accepted and every CreateVolume fail, far
// from the flag.
func TestNQNPrefixLeavesRoomForAVolumeID(t *testing.T) {
	dir := t.TempDir()
	const base = "nqn.2000-02.com.mikrotik:" // 25 bytes
	for i, tc := range []struct {
		prefix string
		serves bool
	}{
		{base + strings.Repeat("a", 180), false},
		{base + strings.Repeat("a", 223-40-len(base)+1), false},
		{base + strings.Repeat("a", 223-40-len(base)), true}, // exactly room for pvc-<uuid>
	} {
		args, endpoint := nodeArgs(dir, i)
		code, serving, stderr := startOrExit(t, append(args, "--nqn-prefix="+tc.prefix), endpoint)
		if tc.serves {
			if !serving || code != 0 {
				t.Errorf("a %d-byte prefix: exit %d, serving %v, stderr %q: want it served", len(tc.prefix), code, serving, stderr)
			}
			continue
		}
		if serving || code != 2 || !strings.Contains(stderr, "--nqn-prefix") || !strings.Contains(stderr, "at most 183 bytes") {
			t.Errorf("a %d-byte prefix: exit %d, serving %v, stderr %q: a prefix no volume NQN fits under was accepted", len(tc.prefix), code, serving, stderr)
		}
	}
}

// Flags documented as "with --storage-fencing=allow-host" or as leader
// election's are refused without their feature, each naming the flag it
// needs, as --heartbeat-threshold and --out-of-service-taint without
// storage fencing are: taken and ignored, the operator would believe them
// in force.
func TestFlagsWithoutTheirFeatureRefused(t *testing.T) {
	dir := t.TempDir()
	host, port, keyFile, knownHosts := startSimulator(t, dir)
	controller := []string{"--mode=controller", "--rds-address=" + host, "--rds-port=" + port,
		"--rds-key-file=" + keyFile, "--rds-known-hosts-file=" + knownHosts, "--publish=false"}
	node := []string{"--mode=node", "--node-id=n1", "--rds-name=rds1", "--node-connector=loop", "--node-loop-data-dir=" + filepath.Join(dir, "pool")}
	for i, tc := range []struct {
		base      []string
		arg, want string
	}{
		{controller, "--attachment-key-file=" + filepath.Join(dir, "missing"), "--attachment-key-file needs --storage-fencing=allow-host"},
		{controller, "--export-reconcile-period=5m", "--export-reconcile-period needs --storage-fencing=allow-host"},
		{controller, "--leader-election-lease-duration=1s", "--leader-election-lease-duration needs --leader-election"},
		{controller, "--leader-election-renew-deadline=1s", "--leader-election-renew-deadline needs --leader-election"},
		{controller, "--leader-election-retry-period=1s", "--leader-election-retry-period needs --leader-election"},
		{controller, "--leader-election-namespace=kube-system", "--leader-election-namespace needs --leader-election"},
		{controller, "--kubeconfig=" + filepath.Join(dir, "kubeconfig"), "--kubeconfig needs --publish"},
		{controller, "--leader-election", "--leader-election needs --publish"},
		{controller, "--not-ready-threshold=1m", "--not-ready-threshold needs --publish"},
		{controller, "--migration-timeout=1m", "--migration-timeout needs --publish"},
		{controller, "--orphaned-claim-threshold=1m", "--orphaned-claim-threshold needs --publish"},
		{controller, "--watch-disconnect-threshold=1m", "--watch-disconnect-threshold needs --publish"},
		{controller, "--fence-call-timeout=1m", "--fence-call-timeout needs --publish"},
		{controller, "--rds-health-interval=1m", "--rds-health-interval needs --publish"},
		{node, "--nvme-ctrl-loss-timeout=10m", "--nvme-ctrl-loss-timeout needs --node-connector=tcp"},
		{node, "--nvme-fast-io-fail-timeout=10s", "--nvme-fast-io-fail-timeout needs --node-connector=tcp"},
		{node, "--node-lease-duration=40s", "--node-lease-duration needs --node-lease"},
		{controller, "--node-lease", "--node-lease needs --mode=node or --mode=all"},
		{node, "--node-lease --node-lease-duration=9s", "--node-lease-duration=9s must be whole seconds, at least 10s"},
		{node, "--node-lease --node-lease-duration=12500ms", "--node-lease-duration=12.5s must be whole seconds"},
		{node, "--node-lease --node-lease-duration=1h", "--node-lease-duration=1h0m0s must be whole seconds, at least 10s (the kubelet's fastest opt-in cadence: a Lease of 10 s renewed every 2.5 s) and at most 2m0s"},
		{node, "--node-lease-namespace=rds-csi", "--node-lease-namespace needs --node-lease"},
		{controller, "--node-lease-namespace=rds-csi", "--node-lease-namespace needs --node-lease"},
		{node, "--node-lease-namespace=kube-node-lease", "--node-lease-namespace must not be kube-node-lease"},
		{node, "--node-lease-namespace=Not_A_Namespace", `--node-lease-namespace "Not_A_Namespace" is not a namespace name`},
	} {
		endpoint := "unix://" + filepath.Join(dir, fmt.Sprintf("csi-%d.sock", i))
		args := append(append([]string{"--endpoint=" + endpoint}, tc.base...), strings.Fields(tc.arg)...)
		code, serving, stderr := startOrExit(t, args, endpoint)
		if serving || code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: exit %d, serving %v, stderr %q: want a usage error naming %q", tc.arg, code, serving, stderr, tc.want)
		}
	}
	// The same flag with its feature on is taken.
	args, endpoint := nodeArgs(dir, 99)
	if code, serving, stderr := startOrExit(t, append(args, "--nvme-ctrl-loss-timeout=10m"), endpoint); !serving {
		t.Errorf("--nvme-ctrl-loss-timeout with --node-connector=tcp: exit %d, stderr %q", code, stderr)
	}
}
