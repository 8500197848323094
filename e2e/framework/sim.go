package framework

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/crypto/ssh"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// Sim is the RDS simulator, in process, over real SSH on loopback, with
// the files the driver needs to reach it: a private key it may log in
// with and a known_hosts pinning the simulator's host key.
type Sim struct {
	*rdssim.Server
	Host           string
	Port           int
	KeyFile        string // OpenSSH private key (0600), authorized on the simulator
	KnownHostsFile string
	PoolDir        string // host directory backing the pool
	// FaultSocket serves the simulator's fault control protocol, as
	// rds-sim --fault-control does (faults.go).
	FaultSocket string
}

// SimOptions configure StartSim.
type SimOptions struct {
	PoolSize int64 // default 100 GiB (sparse files: costs no space)
}

// StartSim starts the simulator with its pool under dir/rds; it is closed
// in tb.Cleanup.
func StartSim(tb testing.TB, tl *Timeline, dir string, opts SimOptions) *Sim {
	tb.Helper()
	if opts.PoolSize == 0 {
		opts.PoolSize = 100 << 30
	}
	keyDir := filepath.Join(dir, "ssh")
	if err := os.MkdirAll(keyDir, 0o700); err != nil {
		tb.Fatal(err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "rds-csi e2e")
	if err != nil {
		tb.Fatal(err)
	}
	keyFile := filepath.Join(keyDir, "id_ed25519")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		tb.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		tb.Fatal(err)
	}
	poolDir := filepath.Join(dir, "rds")
	srv, err := rdssim.New(rdssim.Config{
		DataDir:        poolDir,
		PoolSize:       opts.PoolSize,
		AuthorizedKeys: []ssh.PublicKey{signer.PublicKey()},
		Logger:         klog.Background().WithName("rds-sim"),
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := srv.Close(); err != nil {
			tb.Errorf("rds-sim close: %v", err)
		}
		tl.Logf("rds-sim stopped")
		_ = os.RemoveAll(keyDir) // the driver's private key stays out of the artifacts
	})
	addr, err := srv.Start("127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	knownHosts := filepath.Join(keyDir, "known_hosts")
	if err := srv.WriteKnownHosts(knownHosts); err != nil {
		tb.Fatal(err)
	}
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatal(err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		tb.Fatal(err)
	}
	faultSocket := filepath.Join(SocketDir(tb), "rds-sim-faults.sock")
	fl, err := net.Listen("unix", faultSocket)
	if err != nil {
		tb.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.ServeFaultControl(fl)
	}()
	tb.Cleanup(func() { // before the simulator's close above
		fl.Close()
		<-served
	})
	tl.Logf("rds-sim listening on %s, pool in %s, fault control on %s", addr, poolDir, faultSocket)
	return &Sim{Server: srv, Host: host, Port: port, KeyFile: keyFile, KnownHostsFile: knownHosts, PoolDir: poolDir, FaultSocket: faultSocket}
}

// Disk is the simulator's disk in slot (a volume ID), if it has one.
func (s *Sim) Disk(slot string) (rdssim.DiskInfo, bool) {
	for _, d := range s.Disks() {
		if d.Slot == slot {
			return d, true
		}
	}
	return rdssim.DiskInfo{}, false
}
