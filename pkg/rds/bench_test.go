package rds

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// BenchmarkGetDisk compares `get` commands on one reused SSH connection
// with a new connection (TCP + SSH handshake + auth) per command, through
// a relay that delays each direction by 1 ms (2 ms round trip) in front of
// the simulator, which adds no latency of its own. docs/BENCHMARKS.md
// records the ratio.
func BenchmarkGetDisk(b *testing.B) {
	env := startSim(b, 10*GiB)
	ctx := context.Background()
	setup := env.client(b, nil)
	if _, err := setup.CreateDisk(ctx, req("pvc-bench", GiB)); err != nil {
		b.Fatal(err)
	}
	relay := startDelayRelay(b, net.JoinHostPort(env.host, strconv.Itoa(env.port)), time.Millisecond)
	_, relayPort := splitAddr(b, relay.l.Addr().String())
	known := filepath.Join(b.TempDir(), "known_hosts")
	if err := env.sim.WriteKnownHosts(known, relay.l.Addr().String()); err != nil {
		b.Fatal(err)
	}
	viaRelay := func(c *Config) { c.Port, c.KnownHostsFile = relayPort, known }
	b.Run("reused-connection", func(b *testing.B) {
		c := env.client(b, viaRelay)
		if _, err := c.GetDisk(ctx, "pvc-bench"); err != nil { // dial outside the timing
			b.Fatal(err)
		}
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
		cfg := env.config()
		viaRelay(&cfg)
		for i := 0; i < b.N; i++ {
			c, err := NewClient(cfg)
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
