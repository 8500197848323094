package csi

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// The benchmarks time whole RPCs as the external-provisioner sends them:
// gRPC over a unix socket, the driver, the rds.Client and one SSH exec per
// RouterOS command to the simulator, whose default latency is zero (each
// command still costs a session and an fsync of its state file). The
// latency=5ms variants show how the RouterOS command count per RPC scales
// with a slower RDS. Besides ns/op they report the median RPC latency
// (ms-p50) and RouterOS commands per RPC (cmds/op).

var benchLatencies = []time.Duration{0, 5 * time.Millisecond}

// quietLogs keeps the driver's per-RPC logs out of benchmark output.
func quietLogs(b *testing.B) {
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	b.Cleanup(func() { klog.LogToStderr(true) })
}

func reportRPCs(b *testing.B, env *simEnv, durations []time.Duration, commandsBefore int) {
	b.Helper()
	if len(durations) == 0 {
		return
	}
	slices.Sort(durations)
	b.ReportMetric(float64(durations[len(durations)/2].Microseconds())/1000, "ms-p50")
	b.ReportMetric(float64(durations[len(durations)*99/100].Microseconds())/1000, "ms-p99")
	b.ReportMetric(float64(env.sim.Stats().Commands-commandsBefore)/float64(len(durations)), "cmds/op")
}

func BenchmarkSimCreateVolume(b *testing.B) {
	for _, latency := range benchLatencies {
		b.Run(fmt.Sprintf("latency=%v", latency), func(b *testing.B) {
			quietLogs(b)
			env := startSimEnv(b, simEnvConfig{PoolSize: 1 << 50, Latency: latency})
			ctx := context.Background()
			durations := make([]time.Duration, 0, b.N)
			before := env.sim.Stats().Commands
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if _, err := env.ctrl.CreateVolume(ctx, createReq(fmt.Sprintf("bench-%d", i), rds.GiB)); err != nil {
					b.Fatal(err)
				}
				durations = append(durations, time.Since(start))
			}
			b.StopTimer()
			reportRPCs(b, env, durations, before)
		})
	}
}

func BenchmarkSimDeleteVolume(b *testing.B) {
	for _, latency := range benchLatencies {
		b.Run(fmt.Sprintf("latency=%v", latency), func(b *testing.B) {
			quietLogs(b)
			env := startSimEnv(b, simEnvConfig{PoolSize: 1 << 50})
			ctx := context.Background()
			ids := make([]string, b.N)
			for i := range ids {
				resp, err := env.ctrl.CreateVolume(ctx, createReq(fmt.Sprintf("bench-%d", i), rds.GiB))
				if err != nil {
					b.Fatal(err)
				}
				ids[i] = resp.Volume.VolumeId
			}
			env.sim.SetLatency(latency)
			durations := make([]time.Duration, 0, b.N)
			before := env.sim.Stats().Commands
			b.ResetTimer()
			for _, id := range ids {
				start := time.Now()
				if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
					b.Fatal(err)
				}
				durations = append(durations, time.Since(start))
			}
			b.StopTimer()
			reportRPCs(b, env, durations, before)
		})
	}
}

// BenchmarkSimConcurrentCreateVolume times batches of n CreateVolume calls
// sent at once (ns/op is per batch). Every call must succeed; the volumes
// are deleted between batches, outside the timer.
func BenchmarkSimConcurrentCreateVolume(b *testing.B) {
	for _, n := range []int{10, 50} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			quietLogs(b)
			env := startSimEnv(b, simEnvConfig{PoolSize: 1 << 50})
			ctx := context.Background()
			var all []time.Duration
			before := env.sim.Stats().Commands
			var deleteCommands int
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				durations := make([]time.Duration, n)
				errs := make([]error, n)
				var wg sync.WaitGroup
				for j := 0; j < n; j++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						start := time.Now()
						_, errs[j] = env.ctrl.CreateVolume(ctx, createReq(fmt.Sprintf("batch-%d-%d", i, j), rds.GiB))
						durations[j] = time.Since(start)
					}()
				}
				wg.Wait()
				b.StopTimer()
				for j, err := range errs {
					if err != nil {
						b.Fatalf("batch %d: CreateVolume %d of %d: %v", i, j+1, n, err)
					}
				}
				all = append(all, durations...)
				c := env.sim.Stats().Commands
				for j := 0; j < n; j++ {
					if _, err := env.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: VolumeIDFromName(fmt.Sprintf("batch-%d-%d", i, j))}); err != nil {
						b.Fatal(err)
					}
				}
				deleteCommands += env.sim.Stats().Commands - c
				b.StartTimer()
			}
			b.StopTimer()
			reportRPCs(b, env, all, before+deleteCommands)
		})
	}
}
