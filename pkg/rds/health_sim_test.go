package rds

import (
	"bytes"
	"context"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// TestHealthAgainstSimulator: the three health commands over SSH, the
// output wrapped at 80 columns: a failed drive degrades the array, a hot
// drive's temperature and warning come through, the pool's capacity, a
// volume written through its backing file shows writes and the other
// none, and the pool's monitor-traffic reads.
func TestHealthAgainstSimulator(t *testing.T) {
	env := startSim(t, 20*GiB)
	c := env.client(t, nil)
	ctx := context.Background()
	for _, slot := range []string{"pvc-1", "pvc-2"} {
		if _, err := c.CreateDisk(ctx, req(slot, GiB)); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.sim.FailDrive("nvme4"); err != nil {
		t.Fatal(err)
	}
	if err := env.sim.SetDriveSmart("nvme2", rdssim.DriveSmart{Temperature: 81, PercentageUsed: 12, CriticalWarning: 2}); err != nil {
		t.Fatal(err)
	}
	r, err := c.Health(ctx, "storage-pool")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Skipped) != 0 || len(r.Arrays) != 1 || r.Arrays[0].Slot != rdssim.ArraySlot || !r.Arrays[0].Degraded() ||
		len(r.Arrays[0].Members) != 6 || len(r.Arrays[0].Failed) != 1 || r.Arrays[0].Failed[0] != "nvme4" {
		t.Fatalf("report %+v", r)
	}
	if r.Pool == nil || r.Pool.Capacity.Total != 20*GiB || r.Pool.Capacity.Free != 18*GiB || len(r.Volumes) != 2 || len(r.Drives) != 6 {
		t.Fatalf("pool %+v volumes %+v drives %d", r.Pool, r.Volumes, len(r.Drives))
	}
	if err := env.sim.WriteDisk("pvc-1", 0, bytes.Repeat([]byte{1}, 1<<20)); err != nil {
		t.Fatal(err)
	}
	st, err := c.DiskStats(ctx)
	if err != nil || len(st.Skipped) != 0 {
		t.Fatalf("stats: %v, skipped %+v", err, st.Skipped)
	}
	r.ApplyStats(st)
	if io := r.Volumes[0].IO; r.Volumes[0].Slot != "pvc-1" || io.WriteBytes != 1<<20 || io.WriteOps != 256 || io.Has&IOInFlight == 0 {
		t.Errorf("pvc-1 %+v", r.Volumes[0])
	}
	if io := r.Volumes[1].IO; io.WriteOps != 0 || io.WriteBytes != 0 || io.Has&IOWriteOps == 0 {
		t.Errorf("pvc-2 %+v", r.Volumes[1])
	}
	if d := r.Drives[1]; d.Slot != "nvme2" || d.Temperature == nil || *d.Temperature != 81 || *d.CriticalWarning != 2 || *d.PercentageUsed != 12 {
		t.Errorf("nvme2 %+v", d)
	}
	pool, err := c.PoolTraffic(ctx, r.Pool.Slot)
	if err != nil || pool.Has&(IOWriteOpsRate|IOInFlight|IOWriteRate) != IOWriteOpsRate|IOInFlight|IOWriteRate || pool.WriteBytes != 1<<20 {
		t.Errorf("pool traffic %+v, %v", pool, err)
	}
}
