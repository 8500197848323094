package rdshealth

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// simClient starts the simulator (real SSH, wrapping at 80 columns) and
// a client of it.
func simClient(t *testing.T) (*rdssim.Server, *rds.Client) {
	t.Helper()
	signer, pub, err := rdssim.NewTestKeys()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sim, err := rdssim.New(rdssim.Config{DataDir: filepath.Join(dir, "pool"), PoolSize: 10 * rds.GiB,
		HostKeyPath: filepath.Join(dir, "host_key"), AuthorizedKeys: []ssh.PublicKey{pub}})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	known := filepath.Join(dir, "known_hosts")
	if err := sim.WriteKnownHosts(known); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	c, err := rds.NewClient(rds.Config{Address: host, Port: p, User: "admin", Signer: signer, KnownHostsFile: known, LoginOptions: "ct"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return sim, c
}

// TestPollAgainstSimulator: a poll over SSH sees the simulator's array
// degrade when a drive fails and recover when it is restored, a hot drive,
// and the writes of the one volume written.
func TestPollAgainstSimulator(t *testing.T) {
	sim, c := simClient(t)
	ctx := context.Background()
	for _, slot := range []string{"pvc-a", "pvc-b", "snap-1"} {
		if _, err := c.CreateDisk(ctx, rds.CreateDiskRequest{Slot: slot, FilePath: "/storage-pool/k8s/" + slot + ".img", Size: rds.GiB}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := New(c, Config{Pool: "storage-pool", Interval: time.Minute, PVName: pvOf})
	if err != nil {
		t.Fatal(err)
	}
	defer p.startForTest()()
	if err := sim.FailDrive("nvme3"); err != nil {
		t.Fatal(err)
	}
	if err := sim.SetDriveSmart("nvme5", rdssim.DriveSmart{Temperature: 79}); err != nil {
		t.Fatal(err)
	}
	if err := sim.WriteDisk("pvc-b", 0, make([]byte, 8192)); err != nil {
		t.Fatal(err)
	}
	if err := sim.WriteDisk("pvc-b", 0, []byte{1, 2, 3}); err != nil { // allocates the first page
		t.Fatal(err)
	}
	if err := p.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	s := p.View().Snapshot
	if len(s.Arrays) != 1 || !s.Arrays[0].Degraded() || len(s.Arrays[0].Failed) != 1 || s.Arrays[0].Failed[0] != "nvme3" {
		t.Errorf("arrays %+v", s.Arrays)
	}
	if d := s.Drives[4]; d.Slot != "nvme5" || d.Temperature == nil || *d.Temperature != 79 {
		t.Errorf("drive %+v", d)
	}
	if len(s.Volumes) != 2 || s.Volumes[0].PV != "pv-a" || s.Volumes[0].IO.WriteOps != 0 || s.Volumes[1].IO.WriteOps == 0 || s.Volumes[1].IO.WriteBytes == 0 {
		t.Errorf("volumes %+v", s.Volumes)
	}
	if s.PoolIO == nil || s.Pool == nil || s.Pool.Capacity.Total != 10*rds.GiB || s.Unreadable != 0 {
		t.Errorf("pool %+v %+v, unreadable %d", s.Pool, s.PoolIO, s.Unreadable)
	}
	sim.RestoreArray()
	if err := p.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if s := p.View().Snapshot; s.Arrays[0].Degraded() {
		t.Errorf("after restore: %+v", s.Arrays)
	}
}
