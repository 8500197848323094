package rds

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"net"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// SSH servers and log sinks the client tests share. The simulator's
// fixtures are in client_sim_test.go.

// serveSSH listens on loopback and runs serve for every connection, with
// a server config (no client auth, a fresh host key) for the SSH side;
// it returns the port. For servers that misbehave in ways the simulator
// does not.
func serveSSH(t *testing.T, serve func(c net.Conn, cfg *ssh.ServerConfig)) int {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	hostKey, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(hostKey)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go serve(c, cfg)
		}
	}()
	_, port := splitAddr(t, l.Addr().String())
	return port
}

// scriptedSSH serves exec requests with answer(cmd) as output and exit
// status 0, and records the commands.
type scriptedSSH struct {
	mu   sync.Mutex
	cmds []string
}

func (s *scriptedSSH) serve(t *testing.T, answer func(cmd string) string) int {
	return serveSSH(t, func(c net.Conn, cfg *ssh.ServerConfig) {
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
			go func() {
				for r := range creqs {
					if r.Type != "exec" || len(r.Payload) < 4 {
						r.Reply(false, nil)
						continue
					}
					n := binary.BigEndian.Uint32(r.Payload)
					cmd := string(r.Payload[4 : 4+n])
					s.mu.Lock()
					s.cmds = append(s.cmds, cmd)
					s.mu.Unlock()
					r.Reply(true, nil)
					ch.Write([]byte(answer(cmd)))
					ch.SendRequest("exit-status", false, []byte{0, 0, 0, 0})
					ch.Close()
					return
				}
			}()
		}
	})
}

// syncWriter is a log sink safe for concurrent writers: writes go to w
// under mu.
type syncWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
