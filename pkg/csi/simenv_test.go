package csi

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/crypto/ssh"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// simEnv is the driver as deployed, minus Kubernetes: the real gRPC server
// on a unix socket, the real rds.Client, and the RDS simulator over SSH on
// loopback, backed by sparse files in a temporary directory.
type simEnv struct {
	sim      *rdssim.Server
	endpoint string // unix:///.../csi.sock
	ctrl     csi.ControllerClient
	ident    csi.IdentityClient
	node     csi.NodeClient // with LoopNode
	ns       *NodeServer    // with LoopNode
	signer   ssh.Signer
	stop     func()
}

type simEnvConfig struct {
	DataDir  string        // default: a new temporary directory
	PoolSize int64         // default 100 GiB
	Latency  time.Duration // added by the simulator to every command
	CopyRate int64         // the simulator's copy speed, bytes/s; 0: at once
	Node     csi.NodeServer
	// LoopNode serves the real node service (mode "all", node ID
	// testNodeID) on the same endpoint, its volumes attached as loop
	// devices over the simulator's backing files. Needs root; see
	// requireNodeHost.
	LoopNode bool
	Now      func() time.Time
	// Publish serves ControllerPublish/Unpublish on an attachment index
	// over a fake API that holds the node testNodeID; CreateVolume also
	// creates the volume's PersistentVolume there (the provisioner's part).
	Publish bool
	// Sim and Opts, when set, change the simulator's config and the
	// driver's options before they are used.
	Sim  func(*rdssim.Config)
	Opts func(*Options)
}

const testNodeID = "node-1"

func startSimEnv(t testing.TB, cfg simEnvConfig) *simEnv {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = filepath.Join(t.TempDir(), "pool")
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 100 * rds.GiB
	}
	signer, pub, err := rdssim.NewTestKeys()
	if err != nil {
		t.Fatal(err)
	}
	var exporter rdssim.Exporter
	if cfg.LoopNode && vmTransport != nil {
		exporter = vmTransport.exporter(t)
	}
	simCfg := rdssim.Config{DataDir: cfg.DataDir, PoolSize: cfg.PoolSize, AuthorizedKeys: []ssh.PublicKey{pub}, Latency: cfg.Latency, CopyRate: cfg.CopyRate, Exporter: exporter}
	if cfg.Sim != nil {
		cfg.Sim(&simCfg)
	}
	sim, err := rdssim.New(simCfg)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	knownHosts := filepath.Join(t.TempDir(), "known_hosts")
	if err := sim.WriteKnownHosts(knownHosts); err != nil {
		t.Fatal(err)
	}
	host, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	// No width in the login options: the simulator wraps at 80 columns, as
	// the hardware did, so the driver's tests read wrapped output too.
	client, err := rds.NewClient(rds.Config{Address: host, Port: port, User: "admin", Signer: signer, KnownHostsFile: knownHosts, LoginOptions: "ct"})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{
		Mode: ModeController, DriverName: DefaultDriverName,
		Endpoint:   "unix://" + filepath.Join(t.TempDir(), "csi.sock"),
		RDSAddress: host, RDSPort: port, RDSUser: "admin", RDSKeyFile: "unused", RDSKnownHostsFile: knownHosts, RDSLoginOptions: "ct",
		RDSPool: rdssim.DefaultPoolName, VolumePath: "/storage-pool/kubernetes-volumes",
		NVMePort: 4420, NQNPrefix: testNQNPrefix, ShutdownGrace: 5 * time.Second,
	}
	if cfg.LoopNode {
		opts.Mode, opts.NodeID = ModeAll, testNodeID
	}
	if cfg.Opts != nil {
		cfg.Opts(&opts)
	}
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	d := NewDriver(opts, client)
	cs := NewControllerServer(d, nil)
	if cfg.Now != nil {
		cs.now = cfg.Now
	}
	var ns *NodeServer
	if cfg.LoopNode {
		var c Connector = newSimLoopConnector(t, sim, d)
		if vmTransport != nil {
			c = vmTransport.connector(t, d)
		}
		ns = NewNodeServer(d, c, filepath.Join(t.TempDir(), "node-state"))
		cfg.Node = ns
	}
	var controller csi.ControllerServer = cs
	if cfg.Publish {
		controller = enablePublish(t, cs, testNodeID)
	}
	srv := NewGRPCServer(NewIdentityServer(d), controller, cfg.Node)
	lis, err := Listen(opts.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, srv, lis, opts.ShutdownGrace) }()
	conn, err := grpc.NewClient(opts.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	env := &simEnv{sim: sim, endpoint: opts.Endpoint, signer: signer,
		ctrl: csi.NewControllerClient(conn), ident: csi.NewIdentityClient(conn), node: csi.NewNodeClient(conn), ns: ns}
	stopped := false
	env.stop = func() {
		if stopped {
			return
		}
		stopped = true
		conn.Close()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		client.Close()
		sim.Close()
	}
	t.Cleanup(env.stop)
	return env
}

// vmTransport, when set (by node_vm_test.go in the NVMe/TCP VM tier, build
// tag nvmevm), replaces the loop devices of LoopNode environments with the
// real thing: the simulator exports through the kernel's nvmet and the node
// connects with the TCP connector, so every node test runs over NVMe/TCP.
var vmTransport interface {
	exporter(t testing.TB) rdssim.Exporter
	connector(t testing.TB, d *Driver) Connector
}

// newSimLoopConnector "connects" a volume by attaching the simulator's
// backing file of the disk exported under its NQN to a loop device. A disk
// that is gone resolves to the file it had, so that a loop device left
// over a deleted file can still be found and detached.
func newSimLoopConnector(t testing.TB, sim *rdssim.Server, d *Driver) *nvme.LoopConnector {
	t.Helper()
	resolve := func(_ context.Context, nqn string) (string, error) {
		slot, ok := strings.CutPrefix(nqn, d.opts.NQNPrefix)
		if !ok {
			return "", errors.New("not this driver's NQN")
		}
		file, err := sim.BackingFile(slot)
		if errors.Is(err, rdssim.ErrNotFound) {
			rel := strings.TrimPrefix(d.volumeFilePath(slot), "/"+rdssim.DefaultPoolName+"/")
			return filepath.Join(sim.DataDir(), filepath.FromSlash(rel)), nil
		}
		return file, err
	}
	l, err := nvme.NewLoopConnector(nvme.LoopConfig{NQNPrefix: d.opts.NQNPrefix, Resolve: resolve})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// routerOS runs one command on the simulator as an operator would, by
// hand over SSH, outside the driver.
func (e *simEnv) routerOS(t *testing.T, command string) string {
	t.Helper()
	c, err := ssh.Dial("tcp", e.sim.Addr(), &ssh.ClientConfig{
		User: "admin", Auth: []ssh.AuthMethod{ssh.PublicKeys(e.signer)},
		HostKeyCallback: ssh.FixedHostKey(e.sim.HostPublicKey()), Timeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	out, err := sess.CombinedOutput(command)
	if err != nil {
		t.Fatalf("%s: %v", command, err)
	}
	return string(out)
}

func (e *simEnv) disk(slot string) (rdssim.DiskInfo, bool) {
	for _, d := range e.sim.Disks() {
		if d.Slot == slot {
			return d, true
		}
	}
	return rdssim.DiskInfo{}, false
}
