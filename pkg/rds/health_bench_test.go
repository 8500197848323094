package rds

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// BenchmarkHealthPoll1000 measures the SSH cost of the health poll at
// 1 000 volumes against the simulator, through a relay that delays each
// direction by 1 ms (2 ms round trip), with the driver's login options:
// the poll's three commands (`/disk print detail`, `/disk print stats
// detail`, `/disk monitor-traffic <pool> once`), and the alternative the
// poll does not take, one `/disk monitor-traffic <slot> once` per volume.
// It reports the bytes RouterOS printed and the commands per poll;
// docs/operations.md records a run. The alternative runs only with
// RDS_CSI_BENCH_MONITOR_PER_VOLUME=1 (seconds an iteration).
func BenchmarkHealthPoll1000(b *testing.B) {
	const volumes = 1000
	env := startSim(b, 2*TiB)
	ctx := context.Background()
	setup := env.client(b, nil)
	for i := range volumes {
		slot := fmt.Sprintf("pvc-%04d", i)
		if _, err := setup.CreateDisk(ctx, CreateDiskRequest{Slot: slot, FilePath: "/storage-pool/kubernetes-volumes/" + slot + ".img", Size: GiB,
			Export: &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:" + slot}}); err != nil {
			b.Fatal(err)
		}
	}
	relay := startDelayRelay(b, fmt.Sprintf("%s:%d", env.host, env.port), 1e6)
	_, relayPort := splitAddr(b, relay.l.Addr().String())
	known := filepath.Join(b.TempDir(), "known_hosts")
	if err := env.sim.WriteKnownHosts(known, relay.l.Addr().String()); err != nil {
		b.Fatal(err)
	}
	var bytes, commands, detail, stats atomic.Int64
	c := env.client(b, func(c *Config) {
		c.Port, c.KnownHostsFile, c.LoginOptions = relayPort, known, DefaultLoginOptions
		c.Observer = func(r CommandRecord) {
			bytes.Add(int64(len(r.Output)))
			commands.Add(1)
			switch r.Command {
			case "/disk print detail":
				detail.Add(int64(len(r.Output)))
			case "/disk print stats detail":
				stats.Add(int64(len(r.Output)))
			}
		}
	})
	if _, err := c.Probe(ctx); err != nil { // dial outside the timing
		b.Fatal(err)
	}
	report := func(b *testing.B) {
		b.ReportMetric(float64(bytes.Load())/float64(b.N), "bytes/poll")
		b.ReportMetric(float64(commands.Load())/float64(b.N), "commands/poll")
		if n := detail.Load(); n > 0 {
			b.ReportMetric(float64(n)/float64(b.N), "detail-bytes/poll")
			b.ReportMetric(float64(stats.Load())/float64(b.N), "stats-bytes/poll")
		}
	}
	b.Run("print-detail+stats+pool-monitor", func(b *testing.B) {
		bytes.Store(0)
		commands.Store(0)
		detail.Store(0)
		stats.Store(0)
		for i := 0; i < b.N; i++ {
			r, err := c.Health(ctx, "storage-pool")
			if err != nil {
				b.Fatal(err)
			}
			st, err := c.DiskStats(ctx)
			if err != nil {
				b.Fatal(err)
			}
			r.ApplyStats(st)
			if _, err := c.PoolTraffic(ctx, r.Pool.Slot); err != nil {
				b.Fatal(err)
			}
			if len(r.Volumes) != volumes || len(r.Skipped)+len(st.Skipped) != 0 || r.Volumes[volumes-1].IO.Has == 0 {
				b.Fatalf("%d volumes, skipped %d+%d", len(r.Volumes), len(r.Skipped), len(st.Skipped))
			}
		}
		report(b)
	})
	b.Run("monitor-traffic-per-volume", func(b *testing.B) {
		if os.Getenv("RDS_CSI_BENCH_MONITOR_PER_VOLUME") == "" {
			// Seconds per iteration: make bench's 200x would take half an hour.
			b.Skip("set RDS_CSI_BENCH_MONITOR_PER_VOLUME=1 to measure the alternative (about 6 s an iteration)")
		}
		bytes.Store(0)
		commands.Store(0)
		detail.Store(0)
		for i := 0; i < b.N; i++ {
			for v := range volumes {
				if _, err := c.PoolTraffic(ctx, fmt.Sprintf("pvc-%04d", v)); err != nil {
					b.Fatal(err)
				}
			}
		}
		report(b)
	})
}
