package rds

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSlowDialDoesNotHoldOtherCallers: while one caller's dial hangs, a
// caller with a short deadline gets its answer at its deadline, not after
// the dial.
func TestSlowDialDoesNotHoldOtherCallers(t *testing.T) {
	env := startSim(t, GiB)
	hole := newBlackHole(t)
	_, port := splitAddr(t, hole.l.Addr().String())
	c := env.client(t, func(cfg *Config) {
		cfg.Port = port
		cfg.DialTimeout = time.Minute
		cfg.MaxAttempts = 1
		cfg.InsecureSkipHostKeyCheck, cfg.KnownHostsFile = true, ""
	})
	slow := make(chan error, 1)
	go func() { _, err := c.Probe(context.Background()); slow <- err }()
	// Wait until the slow dial is under way.
	for {
		hole.mu.Lock()
		n := len(hole.conns)
		hole.mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Probe(ctx)
	if !errors.Is(err, ErrTransient) {
		t.Errorf("second caller: %v, want ErrTransient", err)
	}
	select {
	case err := <-slow:
		t.Fatalf("the slow dial ended first (%v): the second caller waited for it", err)
	default:
	}
	hole.close()
	if err := <-slow; !errors.Is(err, ErrTransient) {
		t.Errorf("slow dial: %v", err)
	}
}
