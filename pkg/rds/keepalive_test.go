package rds

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// TestKeepaliveNeverKillsCommand: issue 22 item 4. RouterOS's SSH server
// does not support keepalive@openssh.com (a peer driver's finding on
// hardware). Against a server that refuses it, never answers it, or closes
// the connection on it, a command that runs for many keepalive intervals
// completes on its first connection, and the client sends no SSH-level
// keepalive at all: liveness comes from the command deadline and TCP
// keepalive. (Before: an unanswered keepalive dropped the connection under
// the command, a closed one lost it, and the client re-dialled.)
func TestKeepaliveNeverKillsCommand(t *testing.T) {
	for _, mode := range []rdssim.GlobalRequests{rdssim.GlobalRequestsReject, rdssim.GlobalRequestsIgnore, rdssim.GlobalRequestsClose} {
		t.Run(string(mode), func(t *testing.T) {
			env := startSimWith(t, GiB, func(c *rdssim.Config) { c.GlobalRequests = mode })
			c := env.client(t, func(cfg *Config) {
				cfg.KeepAliveInterval = 5 * time.Millisecond
				cfg.MaxAttempts = 1
			})
			// The command takes sixty keepalive intervals.
			env.sim.SetLatency(300 * time.Millisecond)
			if _, err := c.Probe(context.Background()); err != nil {
				t.Fatalf("Probe: %v", err)
			}
			if n := env.sim.Stats().GlobalRequests; n != 0 {
				t.Errorf("the client sent %d SSH global requests (keepalives)", n)
			}
			if n := c.Dials(); n != 1 {
				t.Errorf("%d dials, want 1", n)
			}
		})
	}
}

// TestSilentRDSIsBounded: issue 25. An RDS that accepts the TCP
// connection and sends no SSH banner costs one dial timeout, not one per
// retry (four, 41 s with the defaults), and the error says what was waited
// for.
func TestSilentRDSIsBounded(t *testing.T) {
	env := startSim(t, GiB)
	hole := newBlackHole(t)
	_, port := splitAddr(t, hole.l.Addr().String())
	c := env.client(t, func(cfg *Config) {
		cfg.Port = port
		cfg.DialTimeout = 200 * time.Millisecond
		cfg.MaxAttempts = 4
		cfg.InsecureSkipHostKeyCheck, cfg.KnownHostsFile = true, ""
	})
	_, err := c.Probe(context.Background())
	if !errors.Is(err, ErrTransient) || !strings.Contains(err.Error(), "sent no SSH banner") {
		t.Errorf("Probe: %v, want ErrTransient saying no SSH banner came", err)
	}
	hole.mu.Lock()
	n := len(hole.conns)
	hole.mu.Unlock()
	if n != 1 {
		t.Errorf("%d connections to the silent RDS, want 1", n)
	}
}

// TestUnansweredSessionIsBounded: an RDS that finishes the SSH handshake
// and never answers a session's opening fails the command at its deadline,
// once, instead of holding it for as long as the dead connection lives
// (before: NewSession had no deadline).
func TestUnansweredSessionIsBounded(t *testing.T) {
	var accepted atomic.Int32
	port := serveSSH(t, func(c net.Conn, cfg *ssh.ServerConfig) {
		accepted.Add(1)
		// The handshake, then nothing: channel opens stay unanswered.
		if _, _, reqs, err := ssh.NewServerConn(c, cfg); err == nil {
			ssh.DiscardRequests(reqs)
		}
	})
	env := startSim(t, GiB)
	c := env.client(t, func(cfg *Config) {
		cfg.Port = port
		cfg.CommandTimeout = 200 * time.Millisecond
		cfg.MaxAttempts = 4
		cfg.InsecureSkipHostKeyCheck, cfg.KnownHostsFile = true, ""
	})
	done := make(chan error, 1)
	go func() { _, err := c.Probe(context.Background()); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, ErrTransient) || !strings.Contains(err.Error(), "opening an SSH session") {
			t.Errorf("Probe: %v, want ErrTransient naming the session's opening", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Probe did not return: opening the session has no deadline")
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}
