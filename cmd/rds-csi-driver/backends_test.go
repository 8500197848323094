package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/srvlab/rds-csi/pkg/backends"
	"github.com/srvlab/rds-csi/pkg/metrics"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestABadRDSListStopsTheDriverNamingTheEntry(t *testing.T) {
	dir := t.TempDir()
	base := []string{"--mode=controller", "--publish=false", "--endpoint=unix://" + dir + "/csi.sock", "--rds-address=10.0.0.1", "--rds-name=rack-a",
		"--rds-key-file=" + dir + "/key", "--rds-known-hosts-file=" + dir + "/kh"}
	for _, tc := range []struct {
		name, list string
		code       int
		want       []string
	}{
		{"duplicate name", "rds:\n- {name: rack-b, address: 10.0.1.1}\n- {name: rack-b, address: 10.0.2.1}\n", 2,
			[]string{`--rds-config rds[1] ("rack-b"): name "rack-b" is taken by --rds-config rds[0] ("rack-b")`}},
		{"the flags' box again", "rds:\n- {name: rack-c, address: 10.0.0.1}\n", 2,
			[]string{`SSH address 10.0.0.1:22 is the RDS of the --rds-* flags ("rack-a")'s already`}},
		{"not a label value", "rds:\n- {name: rack_b!, address: 10.0.1.1}\n", 2, []string{`name "rack_b!" is not a Kubernetes label value`}},
		{"a misspelt key", "rds:\n- {name: rack-b, adress: 10.0.1.1}\n", 2, []string{`unknown field "adress"`}},
	} {
		var stdout, stderr bytes.Buffer
		args := append(append([]string{}, base...), "--rds-config="+writeFile(t, dir, "rds.yaml", tc.list))
		code := run(context.Background(), args, &stdout, &stderr)
		out := stderr.String()
		if code != tc.code || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("%s: exit %d, stderr %q; want %d and one line", tc.name, code, out, tc.code)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: %q does not say %q", tc.name, out, w)
			}
		}
	}
	var stderr bytes.Buffer
	if code := run(context.Background(), append(base, "--rds-config="+dir+"/absent.yaml"), &bytes.Buffer{}, &stderr); code != 1 || !strings.Contains(stderr.String(), "absent.yaml") {
		t.Errorf("unreadable list: exit %d, %q; want 1 naming the file", code, stderr.String())
	}
}

// simBox is one simulator with the files the driver needs for it.
type simBox struct {
	sim        *rdssim.Server
	host, port string
}

func startSimBox(t *testing.T, dir string, pub ssh.PublicKey, knownHosts string) *simBox {
	t.Helper()
	sim, err := rdssim.New(rdssim.Config{DataDir: filepath.Join(dir, "pool"), AuthorizedKeys: []ssh.PublicKey{pub}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	addr, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.WriteKnownHosts(knownHosts); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	return &simBox{sim: sim, host: host, port: port}
}

// TestTheControllerServesEveryBoxOfItsList runs the binary against two
// simulators: a StorageClass pin sends a volume to the second, whose ID
// names it, and a box whose known_hosts has no line stops the driver
// naming the box.
func TestTheControllerServesEveryBoxOfItsList(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	pub, err := rdssim.WriteClientKey(keyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	a := startSimBox(t, filepath.Join(dir, "a"), pub, filepath.Join(dir, "a.known_hosts"))
	b := startSimBox(t, filepath.Join(dir, "b"), pub, filepath.Join(dir, "b.known_hosts"))
	list := writeFile(t, dir, "rds.yaml", "rds:\n- name: rack-b\n  address: "+b.host+"\n  port: "+b.port+"\n  nvmePort: 4421\n  knownHostsFile: "+filepath.Join(dir, "b.known_hosts")+"\n")
	endpoint := "unix://" + filepath.Join(dir, "csi.sock")
	args := []string{"--mode=controller", "--publish=false", "--endpoint=" + endpoint, "--rds-address=" + a.host, "--rds-port=" + a.port,
		"--rds-name=rack-a", "--rds-user=admin", "--rds-key-file=" + keyFile, "--rds-known-hosts-file=" + filepath.Join(dir, "a.known_hosts"),
		"--rds-config=" + list}

	// rack-b pinned by the default box's known_hosts, which has no line for it.
	var stderr bytes.Buffer
	bad := writeFile(t, dir, "bad.yaml", "rds:\n- {name: rack-b, address: "+b.host+", port: "+b.port+", nvmePort: 4421}\n")
	badArgs := append(append([]string{}, args[:len(args)-1]...), "--rds-config="+bad)
	if code := run(context.Background(), badArgs, &bytes.Buffer{}, &stderr); code != 1 || !strings.Contains(stderr.String(), "RDS client of RDS rack-b (--rds-config)") || !strings.Contains(stderr.String(), "has no entry") {
		t.Fatalf("a box without its host key: exit %d, %q", code, stderr.String())
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	stderr.Reset()
	go func() { exit <- run(ctx, args, &bytes.Buffer{}, &stderr) }()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	const pvc = "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	resp, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: pvc, Parameters: map[string]string{"rds": "rack-b"}, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetVolume().GetVolumeId() != "rack-b/"+pvc || resp.GetVolume().GetVolumeContext()["nvmePort"] != "4421" {
		t.Fatalf("volume %v", resp.GetVolume())
	}
	onB, onA := false, false
	for _, d := range b.sim.Disks() {
		onB = onB || d.Slot == pvc
	}
	for _, d := range a.sim.Disks() {
		onA = onA || d.Slot == pvc
	}
	if !onB || onA {
		t.Fatalf("disk on rack-b: %v, on rack-a: %v", onB, onA)
	}
	cancel()
	if code := <-exit; code != 0 {
		t.Errorf("exit %d: %s", code, stderr.String())
	}
}

func TestANodePluginReportsTheBoxesOfItsList(t *testing.T) {
	dir := t.TempDir()
	endpoint := "unix://" + filepath.Join(dir, "csi.sock")
	const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:0f6c2d1e-8a7b-4c3d-9e0f-1a2b3c4d5e6f"
	writeFile(t, dir, "hostnqn", hostNQN+"\n")
	list := writeFile(t, dir, "rds.yaml", "rds:\n- {name: rack-b, address: 10.0.1.1, nodes: [\"rack-b-*\"]}\n- {name: rack-c, address: 10.0.2.1, nodes: [\"rack-c-*\"]}\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exit := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		exit <- run(ctx, []string{"--mode=node", "--endpoint=" + endpoint, "--node-id=rack-b-1", "--rds-name=rack-a",
			"--rds-config=" + list, "--node-nvme-dir=" + dir}, &bytes.Buffer{}, &stderr)
	}()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	info, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	got := info.GetAccessibleTopology().GetSegments()
	if got["topology.rds.csi.srvlab.io/rds"] != "rack-a" || got["topology.rds.csi.srvlab.io/rds.rack-a"] != "true" ||
		got["topology.rds.csi.srvlab.io/rds.rack-b"] != "true" || len(got) != 3 {
		t.Errorf("segments %v: want rack-a (both keys) and rack-b, not rack-c", got)
	}
	cancel()
	if code := <-exit; code != 0 {
		t.Errorf("exit %d: %s", code, stderr.String())
	}
}

// Two entries whose known_hosts pin one host key are one RDS under two
// names (an IP address and a host name, or two ports of one gateway):
// each of its disks would go by two volume IDs, whose claims are kept
// apart, and its free space would count twice.
func TestTwoBoxesPinningOneHostKeyStopTheDriver(t *testing.T) {
	dir := t.TempDir()
	pub, err := rdssim.WriteClientKey(filepath.Join(dir, "host"), "")
	if err != nil {
		t.Fatal(err)
	}
	other, err := rdssim.WriteClientKey(filepath.Join(dir, "other"), "")
	if err != nil {
		t.Fatal(err)
	}
	line := func(addr string, k ssh.PublicKey) string { return knownhosts.Line([]string{addr}, k) + "\n" }
	kh := writeFile(t, dir, "kh", line("10.0.0.1", pub)+line("rds-a.example.internal", pub)+line("10.0.2.1", other))
	base := []string{"--mode=controller", "--publish=false", "--endpoint=unix://" + dir + "/csi.sock", "--rds-address=10.0.0.1", "--rds-name=rack-a",
		"--rds-key-file=" + dir + "/key", "--rds-known-hosts-file=" + kh}
	var stderr bytes.Buffer
	list := writeFile(t, dir, "rds.yaml", "rds:\n- {name: rack-c, address: 10.0.2.1}\n- {name: rack-b, address: rds-a.example.internal}\n")
	code := run(context.Background(), append(base, "--rds-config="+list), &bytes.Buffer{}, &stderr)
	want := `--rds-config rds[1] ("rack-b"): its pinned host key ` + ssh.FingerprintSHA256(pub) + ` is pinned for the RDS of the --rds-* flags ("rack-a") too`
	if code != 2 || !strings.Contains(stderr.String(), want) {
		t.Fatalf("exit %d, %q; want 2 saying %q", code, stderr.String(), want)
	}
}

// TestABoxRefusingTheKeyIsNotConnected: rds_csi_rds_ssh_connected is 0 for
// a box that refuses the driver's SSH key and 1 for a box that answers,
// each under its own name. It was 1 for the refusing box (only a
// transport failure counted as not connected), so the RDSUnreachable
// alert never fired for a rotated key.
func TestABoxRefusingTheKeyIsNotConnected(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	pub, err := rdssim.WriteClientKey(keyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	_, other, err := rdssim.NewTestKeys()
	if err != nil {
		t.Fatal(err)
	}
	good := startSimBox(t, filepath.Join(dir, "a"), pub, filepath.Join(dir, "a.known_hosts"))
	refusing := startSimBox(t, filepath.Join(dir, "b"), other, filepath.Join(dir, "b.known_hosts"))
	box := func(name string, s *simBox, knownHosts string) backends.Backend {
		port, _ := strconv.Atoi(s.port)
		return backends.Backend{Name: name, Address: s.host, Port: port, User: "admin", KeyFile: keyFile, KnownHostsFile: knownHosts, LoginOptions: "ct"}
	}
	m := metrics.New()
	boxes, err := newRDSBoxes([]backends.Backend{box("rack-a", good, filepath.Join(dir, "a.known_hosts")), box("rack-b", refusing, filepath.Join(dir, "b.known_hosts"))}, m)
	if err != nil {
		t.Fatal(err)
	}
	defer boxes.Close()
	if _, err := boxes.clients[0].Clock(context.Background()); err != nil {
		t.Fatalf("rack-a: %v", err)
	}
	if _, err := boxes.clients[1].Clock(context.Background()); !errors.Is(err, rds.ErrAuthRefused) {
		t.Fatalf("rack-b: %v; want the key refused", err)
	}
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "rds_csi_rds_ssh_connected" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "rds" {
					got[l.GetValue()] = s.GetGauge().GetValue()
				}
			}
		}
	}
	if got["rack-a"] != 1 || got["rack-b"] != 0 || len(got) != 2 {
		t.Fatalf("rds_csi_rds_ssh_connected %v; want rack-a 1, rack-b 0 (it refuses the key)", got)
	}
}
