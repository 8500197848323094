package rdssim

import (
	"net"

	"golang.org/x/crypto/ssh"
)

// GlobalRequests is how the simulator answers SSH global requests, such as
// OpenSSH's keepalive@openssh.com. RouterOS's SSH server does not support
// keepalive@openssh.com (found on hardware by a peer driver); whether it
// refuses it, leaves it unanswered or drops the connection is not known,
// so the simulator offers each, and a client must survive all three.
type GlobalRequests string

const (
	// GlobalRequestsReject answers every request that wants a reply with
	// a failure (the default; what an SSH server that knows no global
	// requests does).
	GlobalRequestsReject GlobalRequests = "reject"
	// GlobalRequestsIgnore never answers.
	GlobalRequestsIgnore GlobalRequests = "ignore"
	// GlobalRequestsClose closes the connection on the first one.
	GlobalRequestsClose GlobalRequests = "close"
)

// ParseGlobalRequests parses "reject", "ignore" or "close" ("" is reject).
func ParseGlobalRequests(s string) (GlobalRequests, error) {
	return parseChoice("global requests", s, GlobalRequestsReject, GlobalRequestsIgnore, GlobalRequestsClose)
}

// serveGlobalRequests handles a connection's global requests as
// configured, counting them (Stats.GlobalRequests).
func (s *Server) serveGlobalRequests(c net.Conn, reqs <-chan *ssh.Request) {
	for r := range reqs {
		s.connMu.Lock()
		s.stats.GlobalRequests++
		s.connMu.Unlock()
		switch s.globalReqs {
		case GlobalRequestsIgnore:
		case GlobalRequestsClose:
			c.Close()
		default:
			if r.WantReply {
				_ = r.Reply(false, nil)
			}
		}
	}
}
