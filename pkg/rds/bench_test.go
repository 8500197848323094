package rds

import (
	"context"
	"testing"
	"time"
)

// BenchmarkGetDisk compares N `get` commands on one reused SSH connection
// with a new connection (TCP + SSH handshake + auth) per command, against the
// simulator adding 2 ms per command. docs/BENCHMARKS.md records the ratio.
func BenchmarkGetDisk(b *testing.B) {
	env := startSim(b, 10*GiB)
	env.sim.SetLatency(2 * time.Millisecond)
	ctx := context.Background()
	setup := env.client(b, nil)
	if _, err := setup.CreateDisk(ctx, req("pvc-bench", GiB)); err != nil {
		b.Fatal(err)
	}
	b.Run("reused-connection", func(b *testing.B) {
		c := env.client(b, nil)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := c.GetDisk(ctx, "pvc-bench"); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		if c.Dials() != 1 {
			b.Fatalf("dials = %d", c.Dials())
		}
	})
	b.Run("new-connection-per-command", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			c, err := NewClient(env.config())
			if err != nil {
				b.Fatal(err)
			}
			if _, err := c.GetDisk(ctx, "pvc-bench"); err != nil {
				b.Fatal(err)
			}
			c.Close()
		}
	})
}
