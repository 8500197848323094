package rdssim

import (
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// FaultKind is what the simulator does to a command instead of (or besides)
// answering it normally.
type FaultKind int

const (
	// FaultNone: the command runs and is answered normally.
	FaultNone FaultKind = iota
	// FaultFail: the command is not run; the reply is Fault.Output
	// (default "failure: simulated failure").
	FaultFail
	// FaultGarbage: the command runs, but the reply is Fault.Output
	// (default: text no RouterOS parser accepts), exit status 0.
	FaultGarbage
	// FaultDropBeforeExec: the TCP connection is closed before the command
	// runs. Nothing changed on the simulated RDS.
	FaultDropBeforeExec
	// FaultDropAfterExec: the command runs, then the TCP connection is
	// closed without a reply. The change happened; the client cannot know.
	FaultDropAfterExec
	// FaultHang: the command is not run and never answered; the session
	// stays open until the client gives up (closes the session or the
	// connection) or the server closes. For client timeout tests.
	FaultHang
	// FaultLate: the command is held unanswered and runs ("lands") later:
	// Fault.Delay after it arrived, or when ReleaseLate is called,
	// whichever comes first (with no Delay, only when released). It lands
	// even when its client gave up on it meanwhile (its command timeout
	// closed the session, or the connection went), after every command
	// that ran in between; the reply follows the landing, to whoever still
	// listens. Only Close discards it unrun. For a slow RDS whose command
	// takes effect after the client's timeout made it move on.
	FaultLate
)

func (k FaultKind) String() string {
	switch k {
	case FaultNone:
		return "none"
	case FaultFail:
		return "fail"
	case FaultGarbage:
		return "garbage"
	case FaultDropBeforeExec:
		return "drop-before-exec"
	case FaultDropAfterExec:
		return "drop-after-exec"
	case FaultHang:
		return "hang"
	case FaultLate:
		return "late"
	}
	return "unknown"
}

// DefaultGarbage is the reply of a FaultGarbage without an Output.
const DefaultGarbage = "\x1b[9999;H#!garbled@@ 0x7f ===\"unterminated\n\x00\xff\xfe\n"

// DefaultFailure is the reply of a FaultFail without an Output.
const DefaultFailure = "failure: simulated failure"

// Fault is one armed fault. Counting is deterministic: every command that
// contains Match (every command when Match is empty) counts, in the order
// the simulator receives them, from the moment the fault is injected.
type Fault struct {
	Kind FaultKind
	// Nth is the matching command the fault hits: 1 (or 0) is the next one.
	Nth int
	// Match, when set, restricts the fault (and its counting) to commands
	// that contain this substring.
	Match string
	// Output replaces the reply for FaultFail and FaultGarbage.
	Output string
	// Count is how many matching commands are hit, starting with the Nth:
	// 0 or 1 hits one; a negative Count hits every later one until
	// ClearFaults.
	Count int
	// Delay is how long a FaultLate command is held before it lands; 0
	// holds it until ReleaseLate.
	Delay time.Duration
}

type armedFault struct {
	Fault
	seen  int // matching commands since injection
	fired int
}

// InjectFault arms a fault. When two faults hit the same command, the one
// injected first applies and the other hits the next matching command.
func (s *Server) InjectFault(f Fault) {
	if f.Nth < 1 {
		f.Nth = 1
	}
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.faults = append(s.faults, &armedFault{Fault: f})
}

// FailNth makes the nth command (from now) containing match fail with
// output, a "failure: ..." text, without running it.
func (s *Server) FailNth(n int, match, output string) {
	s.InjectFault(Fault{Kind: FaultFail, Nth: n, Match: match, Output: output})
}

// GarbageNth runs the nth command containing match and replies garbage.
func (s *Server) GarbageNth(n int, match string) {
	s.InjectFault(Fault{Kind: FaultGarbage, Nth: n, Match: match})
}

// DropBeforeExecNth closes the connection when the nth command containing
// match arrives, without running it.
func (s *Server) DropBeforeExecNth(n int, match string) {
	s.InjectFault(Fault{Kind: FaultDropBeforeExec, Nth: n, Match: match})
}

// DropAfterExecNth runs the nth command containing match, then closes the
// connection without replying.
func (s *Server) DropAfterExecNth(n int, match string) {
	s.InjectFault(Fault{Kind: FaultDropAfterExec, Nth: n, Match: match})
}

// HangNth never answers the nth command containing match.
func (s *Server) HangNth(n int, match string) {
	s.InjectFault(Fault{Kind: FaultHang, Nth: n, Match: match})
}

// LateNth holds the nth command containing match and lands it after
// delay (0: when ReleaseLate is called).
func (s *Server) LateNth(n int, match string, delay time.Duration) {
	s.InjectFault(Fault{Kind: FaultLate, Nth: n, Match: match, Delay: delay})
}

// lateBatch is the FaultLate commands held since the last ReleaseLate.
type lateBatch struct {
	release chan struct{} // closed by ReleaseLate
	pending int           // held and not landed (or discarded) yet; under faultMu
	landed  chan struct{} // closed once pending is 0 after the release
}

// ReleaseLate lands every FaultLate command held now, and returns how
// many there were once they have all landed (or the server closed).
// Commands held from now on wait for their delay or the next release.
func (s *Server) ReleaseLate() int {
	s.faultMu.Lock()
	b := s.late
	s.late = nil
	n := 0
	if b != nil {
		n = b.pending
		close(b.release)
		if b.pending == 0 {
			close(b.landed)
		}
	}
	s.faultMu.Unlock()
	if b != nil {
		<-b.landed
	}
	return n
}

// HeldCommands is the number of FaultLate commands held and not landed
// yet, released or not.
func (s *Server) HeldCommands() int {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	return s.held
}

// holdLate registers a command hit by FaultLate (under faultMu) and
// returns its batch.
func (s *Server) holdLate() *lateBatch {
	if s.late == nil {
		s.late = &lateBatch{release: make(chan struct{}), landed: make(chan struct{})}
	}
	s.late.pending++
	s.held++
	return s.late
}

// doneLate: a held command landed or was discarded.
func (s *Server) doneLate(b *lateBatch) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.held--
	b.pending--
	if b.pending == 0 && s.late != b {
		close(b.landed) // released: ReleaseLate waits for it
	}
}

// waitLate holds a FaultLate command until its delay passes or its batch
// is released (true), or the server closes (false). It keeps refusing the
// session's requests while the client is there, and waits on when the
// client has gone.
func (s *Server) waitLate(reqs <-chan *ssh.Request, delay time.Duration, b *lateBatch) bool {
	var timeout <-chan time.Time
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		timeout = t.C
	}
	for {
		select {
		case <-timeout:
			return true
		case <-b.release:
			return true
		case <-s.ctx.Done():
			return false
		case req, ok := <-reqs:
			if !ok {
				reqs = nil // the client gave up; the command still lands
				continue
			}
			req.Reply(false, nil)
		}
	}
}

// ClearFaults disarms every fault. Commands already held by FaultLate stay
// held until their delay or ReleaseLate.
func (s *Server) ClearFaults() {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.faults = nil
}

// PendingFaults is the number of armed faults that have not fired (or, for
// a repeating fault, not finished firing).
func (s *Server) PendingFaults() int {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	return len(s.faults)
}

// SetLatency sets the delay added before every command that arrives from
// now on; commands already received keep theirs.
func (s *Server) SetLatency(d time.Duration) { s.latency.Store(int64(d)) }

// SetRefuseConnections makes the server close every new TCP connection
// right after accepting it (refuse=true), or serve them again (false).
func (s *Server) SetRefuseConnections(refuse bool) { s.refuse.Store(refuse) }

// arrive numbers a command, logs it and picks the fault and the latency
// that apply to it, in one step before the exec request is answered, so
// that log order, sequence numbers and fault counting agree, and a setter
// called after the client's session.Start no longer changes this command.
func (s *Server) arrive(line, user string) (*Command, Fault, *lateBatch, time.Duration) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	s.seq++
	var chosen *armedFault
	kept := s.faults[:0]
	for _, a := range s.faults {
		if a.Match == "" || strings.Contains(line, a.Match) {
			a.seen++
			if chosen == nil && a.seen >= a.Nth {
				chosen = a
				a.fired++
			}
		}
		if a == chosen && a.Count >= 0 && a.fired >= max(a.Count, 1) {
			continue // spent
		}
		kept = append(kept, a)
	}
	clear(s.faults[len(kept):])
	s.faults = kept

	var f Fault
	var late *lateBatch
	if chosen != nil {
		f = chosen.Fault
		if f.Kind == FaultLate {
			late = s.holdLate()
		}
		switch {
		case f.Kind == FaultFail && f.Output == "":
			f.Output = DefaultFailure
		case f.Kind == FaultGarbage && f.Output == "":
			f.Output = DefaultGarbage
		}
	}
	name, width := loginOptions(user)
	c := &Command{Seq: s.seq, User: name, TerminalWidth: width, Text: line, Fault: f.Kind}
	s.logStart(c)
	return c, f, late, time.Duration(s.latency.Load())
}

// Command is one entry of the command log.
type Command struct {
	Seq  int    // 1-based arrival order over the server's life
	User string // SSH user name, without the login options after '+'
	// TerminalWidth is the width the login name asked for ("+511w"); 0
	// when it asked for none.
	TerminalWidth int
	Text          string // the command line as received
	// Output is what the client received; empty when the connection was
	// dropped or the command hung. A FaultLate command's is the reply sent
	// when it landed, whether or not its client still listened.
	Output string
	// Result is what the simulator's command produced when it ran, even
	// when a fault replaced or withheld the reply.
	Result   string
	Executed bool
	Fault    FaultKind
}

// Commands returns a copy of the command log, in arrival order. An entry is
// complete before its reply is sent, so a client that has its reply sees
// its command here.
func (s *Server) Commands() []Command {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	out := make([]Command, len(s.cmdLog))
	for i, c := range s.cmdLog {
		out[i] = *c
	}
	return out
}

// ResetCommands empties the command log. Sequence numbers keep counting.
func (s *Server) ResetCommands() {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	s.cmdLog = nil
}

func (s *Server) logStart(c *Command) {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	s.cmdLog = append(s.cmdLog, c)
}

// logUpdate changes an entry under the log lock (readers copy entries).
func (s *Server) logUpdate(c *Command, fn func(c *Command)) {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	fn(c)
}
