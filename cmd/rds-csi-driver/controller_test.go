package main

import (
	"context"
	"flag"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/srvlab/rds-csi/pkg/claims"
	"github.com/srvlab/rds-csi/pkg/csi"
	"github.com/srvlab/rds-csi/pkg/metrics"
)

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, time.Minute, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// counter sums a counter family's samples in a process's registry.
func counter(t *testing.T, m *metrics.Metrics, family string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, s := range mf.GetMetric() {
			sum += sampleValue(s)
		}
	}
	return sum
}

func sampleValue(s *dto.Metric) float64 {
	if s.Counter != nil {
		return s.Counter.GetValue()
	}
	return s.Gauge.GetValue()
}

type replica struct {
	proc *controllerProcess
	m    *metrics.Metrics
	stop context.CancelFunc
	done chan struct{}
}

func startReplica(t *testing.T, client *fake.Clientset, name string) *replica {
	t.Helper()
	opts := controllerOptions{
		LeaderElection: true, LeaderElectionNamespace: "rds-csi",
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: time.Second,
		MigrationTimeout: 5 * time.Minute, WatchStallThreshold: 30 * time.Second, ReactionTimeout: 15 * time.Second, ExportReconcilePeriod: time.Minute,
		RDSCommandTimeout: DefaultRDSCommandTimeout,
	}
	if err := opts.validate(); err != nil {
		t.Fatal(err)
	}
	dopts := csi.Options{DriverName: csi.DefaultDriverName, NodeID: name}
	m := metrics.New()
	proc, err := newControllerProcess(opts, dopts, client, clientless(dopts), m, func(context.Context) error { return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{proc: proc, m: m, stop: cancel, done: make(chan struct{})}
	go func() { proc.run(ctx); close(r.done) }()
	t.Cleanup(r.kill)
	return r
}

func (r *replica) kill() {
	r.stop()
	<-r.done
}

// TestLeaderElectionRunsFencingOnce: two replicas keep warm indexes; only
// the leader fences a failed node's attachment; when the leader goes, the
// other takes over and serves at once, without restarting anything.
func TestLeaderElectionRunsFencingOnce(t *testing.T) {
	pvName := "pv-1"
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}},
		&corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: pvName, Annotations: map[string]string{claims.ClaimsAnnotation: `{"node-a":"2026-11-23T08:00:00Z"}`}},
			Spec: corev1.PersistentVolumeSpec{
				AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: csi.DefaultDriverName, VolumeHandle: "vol-1"}},
			},
		},
		&storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: "va-1"},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: csi.DefaultDriverName, NodeName: "node-a",
				Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		},
	)
	r1 := startReplica(t, client, "replica-1")
	r2 := startReplica(t, client, "replica-2")
	replicas := []*replica{r1, r2}

	// Readiness: /readyz answers 200 only once the index is synced, and
	// /metrics serves the families.
	srv := httptest.NewServer(r1.proc.health.Handler())
	defer srv.Close()
	waitUntil(t, "/readyz to pass", func() bool {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	var leader, follower *replica
	waitUntil(t, "one leader", func() bool {
		if r1.proc.isLeader() != r2.proc.isLeader() {
			leader, follower = r1, r2
			if r2.proc.isLeader() {
				leader, follower = r2, r1
			}
			return true
		}
		return false
	})
	if counter(t, leader.m, "rds_csi_leader") != 1 || counter(t, follower.m, "rds_csi_leader") != 0 {
		t.Fatal("leader gauge does not match the election")
	}
	for _, r := range replicas {
		waitUntil(t, "warm indexes", func() bool { return r.proc.ctrl.Synced() && r.proc.index.Volume("vol-1") != nil })
	}

	// node-a dies: both indexes see it; the leader alone fences.
	if err := client.CoreV1().Nodes().Delete(context.Background(), "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the claim to be released", func() bool {
		pv, err := client.CoreV1().PersistentVolumes().Get(context.Background(), pvName, metav1.GetOptions{})
		return err == nil && pv.Annotations[claims.ClaimsAnnotation] == ""
	})
	for _, r := range replicas {
		waitUntil(t, "both indexes to drop node-a", func() bool { return !r.proc.index.Node("node-a").Exists })
	}
	// Once in all: the lease may move between the replicas on a loaded
	// machine (3 s leases), so which one fenced is not fixed; that both
	// did is the failure (only a leader's Fencer acts). The count follows
	// the release (the claim goes first), so wait for it.
	fences := func() float64 {
		return counter(t, leader.m, "rds_csi_fences_total") + counter(t, follower.m, "rds_csi_fences_total")
	}
	waitUntil(t, "the fence to be counted", func() bool { return fences() >= 1 })
	if a, b := counter(t, leader.m, "rds_csi_fences_total"), counter(t, follower.m, "rds_csi_fences_total"); a+b != 1 {
		t.Fatalf("fenced %v times by the first leader and %v by the other, want once in all", a, b)
	}

	// The leader goes away (its lease is released on the way out); the
	// follower takes over.
	start := time.Now()
	leader.kill()
	waitUntil(t, "the follower to take over", follower.proc.isLeader)
	t.Logf("takeover after the leader stopped: %s (lease duration %s)", time.Since(start).Round(time.Millisecond), follower.proc.opts.LeaseDuration)
	lease, err := client.CoordinationV1().Leases("rds-csi").Get(context.Background(), leaseName(csi.DefaultDriverName), metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || !strings.HasPrefix(*lease.Spec.HolderIdentity, follower.proc.driver.NodeID) {
		t.Fatalf("lease after takeover: %+v %v", lease, err)
	}

	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
}

// With storage fencing a fence cuts the node off the RDS first, so
// --not-ready-threshold gets a default; an explicit value always wins.
func TestNotReadyThresholdDefaultWithStorageFencing(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{nil, 0},
		{[]string{"--storage-fencing=allow-host"}, StorageFencedNotReadyThreshold},
		{[]string{"--storage-fencing=allow-host", "--not-ready-threshold=0"}, 0},
		{[]string{"--storage-fencing=allow-host", "--not-ready-threshold=45s"}, 45 * time.Second},
		{[]string{"--not-ready-threshold=45s"}, 45 * time.Second},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var d csi.Options
		d.AddFlags(fs)
		var o controllerOptions
		o.addFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		o.storageFencingDefaults(d, fs)
		if o.NotReadyThreshold != tc.want {
			t.Errorf("%v: --not-ready-threshold %s, want %s", tc.args, o.NotReadyThreshold, tc.want)
		}
	}
}

// --heartbeat-threshold defaults on with storage fencing and is refused
// without it (nothing would cut the node off); too short a threshold, or
// a guard share outside (0, 1], is refused.
func TestHeartbeatFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    time.Duration
		problem string
	}{
		{nil, 0, ""},
		{[]string{"--storage-fencing=allow-host"}, StorageFencedHeartbeatThreshold, ""},
		{[]string{"--storage-fencing=allow-host", "--heartbeat-threshold=0"}, 0, ""},
		{[]string{"--storage-fencing=allow-host", "--heartbeat-threshold=30s"}, 30 * time.Second, ""},
		{[]string{"--heartbeat-threshold=30s"}, 30 * time.Second, "--heartbeat-threshold needs --storage-fencing=allow-host"},
		{[]string{"--storage-fencing=allow-host", "--heartbeat-threshold=6s"}, 6 * time.Second, ""},
		{[]string{"--storage-fencing=allow-host", "--heartbeat-threshold=5s"}, 5 * time.Second, ""},
		{[]string{"--storage-fencing=allow-host", "--heartbeat-threshold=4s"}, 4 * time.Second, "shorter than 5s"},
		{[]string{"--storage-fencing=allow-host", "--heartbeat-threshold=-1s"}, -time.Second, "must not be negative"},
		{[]string{"--storage-fencing=allow-host", "--heartbeat-threshold=24h"}, 24 * time.Hour, ""},
		{[]string{"--storage-fencing=allow-host", "--heartbeat-threshold=2562047h"}, 2562047 * time.Hour, "must be at most 24h0m0s"},
		{[]string{"--storage-fencing=allow-host", "--not-ready-threshold=25h"}, StorageFencedHeartbeatThreshold, "must be at most 24h0m0s"},
		{[]string{"--fence-guard-share=0"}, 0, "--fence-guard-share must be a number in (0, 1]"},
		{[]string{"--fence-guard-share=1.5"}, 0, "--fence-guard-share must be a number in (0, 1]"},
		{[]string{"--fence-guard-share=1"}, 0, ""},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var d csi.Options
		d.AddFlags(fs)
		o := controllerOptions{MigrationTimeout: time.Minute, ExportReconcilePeriod: time.Minute, RDSCommandTimeout: DefaultRDSCommandTimeout,
			WatchStallThreshold: time.Second, ReactionTimeout: time.Second}
		o.addFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		o.storageFencingDefaults(d, fs)
		if o.HeartbeatThreshold != tc.want {
			t.Errorf("%v: --heartbeat-threshold %s, want %s", tc.args, o.HeartbeatThreshold, tc.want)
		}
		err := o.validate()
		switch {
		case tc.problem == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.problem != "" && (err == nil || !strings.Contains(err.Error(), tc.problem)):
			t.Errorf("%v: error %v; want one saying %q", tc.args, err, tc.problem)
		}
	}
}
