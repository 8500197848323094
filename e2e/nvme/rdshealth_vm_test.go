//go:build nvmevm

package nvme

// Inside the VM (RDS_NVME_VM=1): issue 27's per-volume I/O over real
// NVMe/TCP. bin/rds-sim exports two volumes through the kernel's nvmet;
// the driver's connector attaches both over the kernel's initiator; fio
// writes 4 MiB with direct I/O to one of them. The health poller runs as
// the controller's leader runs it (pkg/rdshealth on an SSH connection of
// its own, on its interval, volumes named by PV through the slot, which
// is the volume handle) and the driver's metrics (pkg/metrics) read it:
// rds_csi_rds_volume_write_ops_total of the written PV grows, the other
// PV's stays 0. The simulator counts the writes from its backing files
// (the pages nvmet allocated in them), never from anything the test says.

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/srvlab/rds-csi/pkg/metrics"
	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
	"github.com/srvlab/rds-csi/pkg/rdshealth"
)

// healthVolume is one volume of the test: its slot (the volume handle)
// and the PV the controller's index names it by.
type healthVolume struct {
	slot, pv string
	dev      string
}

func TestVMVolumeWriteIOPS(t *testing.T) {
	if os.Getenv("RDS_NVME_VM") != "1" {
		t.Skip("runs inside the NVMe/TCP VM only (make e2e-nvme)")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		t.Fatalf("fio is needed in the VM (the host's, shared; hack/install-deps.sh installs it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	proc := startSimProcess(t, t.TempDir())
	ops := healthSimClient(t, proc, 0)
	sim := &fenceSim{client: ops, dataDir: proc.dataDir}
	conn, hostNQN := fenceConnector(t, nvme.FailIOAtOnce)

	// PV names unlike the handles (a statically provisioned PV): the
	// label must come from the index, not from the slot.
	written := &healthVolume{slot: "pvc-0b7c2d4e-1f6a-4e8b-9c3d-5a6b7c8d9e01", pv: "vm-data-written"}
	idle := &healthVolume{slot: "pvc-0b7c2d4e-1f6a-4e8b-9c3d-5a6b7c8d9e02", pv: "vm-data-idle"}
	pvOf := map[string]string{}
	for _, v := range []*healthVolume{written, idle} {
		nqn := "nqn.2000-02.com.mikrotik:" + v.slot
		sim.fenceDisk(t, ctx, v.slot, nqn, hostNQN)
		dev, err := conn.Connect(ctx, nvme.Target{Address: "127.0.0.1", Port: fencePort, NQN: nqn})
		if err != nil {
			t.Fatalf("connecting %s: %v", v.slot, err)
		}
		v.dev = dev
		pvOf[v.slot] = v.pv
	}

	// The leader's poller: its own connection, one session, the shortest
	// interval the driver accepts.
	polled := make(chan error, 1)
	poller, err := rdshealth.New(healthSimClient(t, proc, 1), rdshealth.Config{
		Pool:     rdssim.DefaultPoolName,
		Interval: rdshealth.MinInterval,
		PVName: func(slot string) (string, bool) {
			pv, ok := pvOf[slot]
			return pv, ok
		},
		Polled: func(err error) {
			select {
			case polled <- err:
			default: // one pending signal is enough: the waiter re-reads the view
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	m.ReportRDSHealth(metrics.RDSHealthSource{RDS: "rds-vm", View: poller.View})
	pctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); poller.Run(pctx) }()
	t.Cleanup(func() { stop(); <-done })

	// Before any write: both volumes attached, both reported, no writes.
	attached := time.Now()
	before := waitSnapshot(t, poller, polled, attached)
	writesBefore := volumeWriteOps(t, m)
	for _, v := range []*healthVolume{written, idle} {
		if n, ok := writesBefore[v.pv]; !ok || n != 0 {
			t.Fatalf("before any write: rds_csi_rds_volume_write_ops_total{pv=%q} = %v (reported: %v), want 0 reported; all: %v", v.pv, n, ok, writesBefore)
		}
	}

	writing := time.Now()
	fioOps, fioBytes := fioWrite(t, written.dev)
	wrote := time.Now()
	after := waitSnapshot(t, poller, polled, wrote)
	writesAfter := volumeWriteOps(t, m)
	delta := writesAfter[written.pv] - writesBefore[written.pv]
	span := after.Taken.Sub(before.Taken)
	t.Logf("VOLUME IO fio wrote %d ops, %d bytes (direct) to %s (%s) in %v; the next poll, %v after the one before the write: %s write ops %v (+%v, %.1f/s), %s write ops %v; polls took %v and %v",
		fioOps, fioBytes, written.dev, written.pv, wrote.Sub(writing).Round(time.Millisecond), span.Round(time.Millisecond), written.pv, writesAfter[written.pv], delta, delta/span.Seconds(), idle.pv, writesAfter[idle.pv],
		before.Took.Round(time.Millisecond), after.Took.Round(time.Millisecond))
	if delta <= 0 {
		t.Errorf("%s (%s): rds_csi_rds_volume_write_ops_total{pv=%q} went from %v to %v across fio's %d writes, want it to grow", written.pv, written.slot, written.pv, writesBefore[written.pv], writesAfter[written.pv], fioOps)
	}
	if n, ok := writesAfter[idle.pv]; !ok || n != 0 {
		t.Errorf("%s, never written: rds_csi_rds_volume_write_ops_total{pv=%q} = %v (reported: %v), want 0 reported", idle.pv, idle.pv, n, ok)
	}
	// Every fio write went to a hole of the backing file: the bytes the
	// simulator saw allocated cover them.
	for _, vol := range after.Volumes {
		if vol.PV == written.pv && vol.IO.WriteBytes < fioBytes {
			t.Errorf("%s: write bytes %d, fewer than the %d fio wrote", written.pv, vol.IO.WriteBytes, fioBytes)
		}
	}
}

// healthSimClient is an rds client of the simulator process, as the
// driver configures one (sessions: 0 is the default).
func healthSimClient(t *testing.T, p simProcess, sessions int) *rds.Client {
	t.Helper()
	c, err := rds.NewClient(rds.Config{Address: p.host, Port: p.port, User: "admin", KeyFile: p.key, KnownHostsFile: p.knownHosts, MaxSessions: sessions})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitSnapshot waits, up to a minute, for the poller's first good
// snapshot taken after since. A failed poll (bounded by the interval, as
// in the driver: a loaded TCG guest can run past it) is logged and the
// next one awaited; the last error is in the failure.
func waitSnapshot(t *testing.T, p *rdshealth.Poller, polled <-chan error, since time.Time) *rdshealth.Snapshot {
	t.Helper()
	const wait = time.Minute
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	var last error
	for {
		if s := p.View().Snapshot; s != nil && s.Taken.After(since) {
			return s
		}
		select {
		case err := <-polled:
			if err != nil {
				t.Logf("a poll of the simulator's health failed: %v", err)
				last = err
			}
		case <-deadline.C:
			t.Fatalf("no good poll of the simulator's health within %v after %s (last error: %v)", wait, since.Format(time.RFC3339Nano), last)
		}
	}
}

// volumeWriteOps scrapes the driver's metrics: the write operations of
// each PV that has the series.
func volumeWriteOps(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "rds_csi_rds_volume_write_ops_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			out[labelValue(s, "pv")] = s.GetCounter().GetValue()
		}
	}
	return out
}

func labelValue(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// fioWrite writes 4 MiB to dev with direct I/O in 4 KiB blocks and returns
// the operations and bytes fio reports written.
func fioWrite(t *testing.T, dev string) (ops, bytes int64) {
	t.Helper()
	args := []string{"--name=write", "--filename=" + dev, "--rw=write", "--bs=4k", "--size=4M", "--direct=1",
		"--ioengine=psync", "--output-format=json"}
	out, err := exec.Command("fio", args...).Output()
	if err != nil {
		t.Fatalf("fio %v: %v\n%s", args, err, out)
	}
	var res struct {
		Jobs []struct {
			Error int `json:"error"`
			Write struct {
				TotalIOs int64 `json:"total_ios"`
				IOBytes  int64 `json:"io_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) != 1 {
		t.Fatalf("fio output (%v):\n%s", err, out)
	}
	j := res.Jobs[0]
	if j.Error != 0 || j.Write.TotalIOs == 0 || j.Write.IOBytes != 4<<20 {
		t.Fatalf("fio: error %d, %d writes, %d bytes; want 4 MiB written\n%s", j.Error, j.Write.TotalIOs, j.Write.IOBytes, out)
	}
	return j.Write.TotalIOs, j.Write.IOBytes
}
