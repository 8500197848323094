package main

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/metrics"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// TestRDSHealthIntervalRange: --rds-health-interval is 0 (off) or 5s..1h.
func TestRDSHealthIntervalRange(t *testing.T) {
	for d, ok := range map[time.Duration]bool{0: true, 5 * time.Second: true, 30 * time.Second: true, time.Hour: true,
		time.Second: false, -time.Second: false, 61 * time.Minute: false} {
		o := controllerOptions{MigrationTimeout: time.Minute, ExportReconcilePeriod: time.Minute, RDSCommandTimeout: DefaultRDSCommandTimeout,
			WatchStallThreshold: 30 * time.Second, ReactionTimeout: time.Second, RDSHealthInterval: d}
		if err := o.validate(); (err == nil) != ok {
			t.Errorf("--rds-health-interval=%s: %v", d, err)
		}
	}
}

func hasFamily(t *testing.T, m *metrics.Metrics, family string) bool {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == family && len(mf.GetMetric()) > 0 {
			return true
		}
	}
	return false
}

// TestOnlyTheLeaderPollsRDSHealth: of two replicas against the simulator
// (real SSH), only the leader polls: it reports the array (degraded once
// a drive fails) and the PV's counters, the other only that it does not
// poll. When the leader goes,
// the other takes over the polls.
func TestOnlyTheLeaderPollsRDSHealth(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id_ed25519")
	pub, err := rdssim.WriteClientKey(key, "test")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := rdssim.New(rdssim.Config{DataDir: filepath.Join(dir, "pool"), PoolSize: 10 * rds.GiB,
		HostKeyPath: filepath.Join(dir, "host_key"), AuthorizedKeys: []ssh.PublicKey{pub}})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	known := filepath.Join(dir, "known_hosts")
	if err := sim.WriteKnownHosts(known); err != nil {
		t.Fatal(err)
	}
	host, portText, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portText)
	if out := sim.Control("io slot=nope write-ops=1"); out == "" {
		t.Fatal("no fault control")
	}
	pv := "pvc-1"
	client := fake.NewClientset(&corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pv},
		Spec: corev1.PersistentVolumeSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: csi.DefaultDriverName, VolumeHandle: "vol-1"}}},
	})
	dopts := csi.Options{DriverName: csi.DefaultDriverName, RDSAddress: host, RDSPort: port, RDSUser: "admin", RDSKeyFile: key,
		RDSKnownHostsFile: known, RDSPool: "storage-pool", RDSLoginOptions: "ct"}
	rc, err := rds.NewClient(dopts.RDSConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := rc.CreateDisk(context.Background(), rds.CreateDiskRequest{Slot: "vol-1", FilePath: "/storage-pool/k8s/vol-1.img", Size: rds.GiB}); err != nil {
		t.Fatal(err)
	}
	if out := sim.Control("io slot=vol-1 write-ops=42 in-flight=2"); out != "ok io vol-1" {
		t.Fatal(out)
	}
	start := func(name string) *replica {
		opts := controllerOptions{
			LeaderElection: true, LeaderElectionNamespace: "rds-csi",
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: time.Second,
			MigrationTimeout: 5 * time.Minute, WatchStallThreshold: 30 * time.Second, ReactionTimeout: 15 * time.Second, ExportReconcilePeriod: time.Minute,
			RDSCommandTimeout: DefaultRDSCommandTimeout, RDSHealthInterval: 5 * time.Second,
		}
		if err := opts.validate(); err != nil {
			t.Fatal(err)
		}
		o := dopts
		o.NodeID = name
		m := metrics.New()
		proc, err := newControllerProcess(opts, o, client, clientless(o), m, func(context.Context) error { return nil }, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		r := &replica{proc: proc, m: m, stop: cancel, done: make(chan struct{})}
		go func() { proc.run(ctx); close(r.done) }()
		t.Cleanup(r.kill)
		return r
	}
	r1, r2 := start("replica-1"), start("replica-2")
	var leader, follower *replica
	waitUntil(t, "one leader", func() bool {
		if r1.proc.isLeader() == r2.proc.isLeader() {
			return false
		}
		leader, follower = r1, r2
		if r2.proc.isLeader() {
			leader, follower = r2, r1
		}
		return true
	})
	waitUntil(t, "the leader's first poll", func() bool { return hasFamily(t, leader.m, "rds_csi_rds_volume_write_ops_total") })
	if counter(t, leader.m, "rds_csi_rds_health_polling") != 1 || counter(t, leader.m, "rds_csi_rds_volume_write_ops_total") != 42 ||
		counter(t, leader.m, "rds_csi_rds_volume_in_flight_ops") != 2 || counter(t, leader.m, "rds_csi_rds_array_degraded") != 0 {
		t.Errorf("leader: polling %v, write ops %v, in flight %v, degraded %v", counter(t, leader.m, "rds_csi_rds_health_polling"),
			counter(t, leader.m, "rds_csi_rds_volume_write_ops_total"), counter(t, leader.m, "rds_csi_rds_volume_in_flight_ops"), counter(t, leader.m, "rds_csi_rds_array_degraded"))
	}
	if counter(t, follower.m, "rds_csi_rds_health_polling") != 0 || hasFamily(t, follower.m, "rds_csi_rds_array_degraded") ||
		hasFamily(t, follower.m, "rds_csi_rds_health_staleness_seconds") || follower.proc.rdsHealth[0].View().Polling {
		t.Error("the follower reports RDS health")
	}
	if err := sim.FailDrive("nvme2"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the array degraded on the leader's next poll", func() bool { return counter(t, leader.m, "rds_csi_rds_array_degraded") == 1 })

	leader.kill()
	waitUntil(t, "the follower to lead and poll", func() bool {
		return follower.proc.isLeader() && counter(t, follower.m, "rds_csi_rds_array_degraded") == 1
	})
}
