package rds

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/crypto/ssh"
)

// A connection lost after the exec request went out and before its reply
// came may have run the command: a conditional set that met it is not
// re-sent (issue 21: a second copy is a second chance for its condition
// to match after its state came back). The server here takes the exec
// request, counts it, and closes the connection without a reply.
func TestConditionalSetNotResentWhenExecReplyLost(t *testing.T) {
	var sets atomic.Int32
	port := serveSSH(t, func(c net.Conn, cfg *ssh.ServerConfig) {
		defer c.Close()
		_, chans, reqs, err := ssh.NewServerConn(c, cfg)
		if err != nil {
			return
		}
		go ssh.DiscardRequests(reqs)
		for nc := range chans {
			ch, creqs, err := nc.Accept()
			if err != nil {
				return
			}
			for r := range creqs {
				if r.Type == "exec" && strings.Contains(string(r.Payload), " set [find where ") {
					sets.Add(1)
					c.Close() // it may have run; no reply
					ch.Close()
					return
				}
				r.Reply(false, nil)
			}
		}
	})
	env := startSim(t, GiB)
	c := env.client(t, func(cfg *Config) {
		cfg.Port = port
		cfg.MaxAttempts = 4
		cfg.InsecureSkipHostKeyCheck, cfg.KnownHostsFile = true, ""
	})
	_, err := c.SwapExport(context.Background(), "pvc-a", ExportState{Open: true, Host: hostA}, ExportState{Open: true, Host: hostB})
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Errorf("SwapExport with the exec reply lost: %v, want ErrOutcomeUnknown", err)
	}
	if n := sets.Load(); n != 1 {
		t.Errorf("the conditional set was sent %d times, want once", n)
	}
}
