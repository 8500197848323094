package rds

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// delayRelay is a TCP relay on loopback that forwards each direction after
// a fixed one-way delay, so every network round trip costs 2×delay: what
// separates a reused connection from a new one (TCP and SSH handshakes,
// key exchange, authentication) is counted in round trips, as across a
// real network. Bandwidth is not limited.
type delayRelay struct {
	l      net.Listener
	target string
	delay  time.Duration
	wg     sync.WaitGroup
}

func startDelayRelay(tb testing.TB, target string, oneWay time.Duration) *delayRelay {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	r := &delayRelay{l: l, target: target, delay: oneWay}
	r.wg.Add(1)
	go r.serve()
	tb.Cleanup(func() { l.Close(); r.wg.Wait() })
	return r
}

func (r *delayRelay) serve() {
	defer r.wg.Done()
	for {
		in, err := r.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", r.target)
		if err != nil {
			in.Close()
			continue
		}
		r.wg.Add(2)
		go r.pipe(in, out)
		go r.pipe(out, in)
	}
}

// pipe copies src to dst, each chunk written delay after it was read.
func (r *delayRelay) pipe(src, dst net.Conn) {
	defer r.wg.Done()
	type chunk struct {
		data []byte
		due  time.Time
	}
	queue := make(chan chunk, 1024)
	go func() {
		defer dst.Close()
		for c := range queue {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.data); err != nil {
				return
			}
		}
	}()
	defer close(queue)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			queue <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(r.delay)}
		}
		if err != nil {
			if err != io.EOF {
				src.Close()
			}
			return
		}
	}
}

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
