package rdssim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The fault control protocol arms faults in a running simulator from
// another process (rds-sim --fault-control): one request per line, one
// answer line per request, "ok[ <details>]" or "error: <why>". Requests:
//
//	<kind> [nth=<n>] [match=<text>] [count=<n>|count=all] [delay=<duration>] [output=<text>]
//	release
//	clear
//	status
//
// kind is fail, garbage, drop-before-exec, drop-after-exec, hang or late
// (FaultKind's names). match is the substring a command must contain to
// count (default: every command), output the reply of fail and garbage,
// delay how long a late command is held (default: until release). A text
// with a space, a quote or a backslash is written as a Go string literal
// ("..."); a bare one is taken as it is. nth defaults to 1 (the next
// matching command), count to 1; count=all hits every matching command
// until clear. release lands every held late command and answers "ok
// released=<n>" once they have landed; clear disarms every fault (held
// commands stay held); status answers "ok armed=<n> held=<n>". Anything
// else is refused: an unknown kind or key, a key twice or on a kind it
// does not apply to, a value out of range, a line longer than
// MaxFaultControlLine.

//
// The hardware requests (drive, smart, io) steer the simulated array, its
// drives' S.M.A.R.T. values and the disks' I/O counters: ControlHardware.

// MaxFaultControlLine is the longest request line accepted, in bytes.
const MaxFaultControlLine = 4096

// Bounds of the fault control protocol's values.
const (
	maxFaultNth   = 1_000_000
	maxFaultCount = 1_000_000
	maxFaultText  = 1024
	maxFaultDelay = time.Hour
)

// FaultRequest is one parsed request line.
type FaultRequest struct {
	// Op is "arm", "release", "clear" or "status".
	Op string
	// Fault is the fault to arm (Op "arm").
	Fault Fault
}

var faultKinds = map[string]FaultKind{
	"fail": FaultFail, "garbage": FaultGarbage, "drop-before-exec": FaultDropBeforeExec,
	"drop-after-exec": FaultDropAfterExec, "hang": FaultHang, "late": FaultLate,
}

// ParseFaultRequest parses one request of the fault control protocol
// (see the top of this file), strictly.
func ParseFaultRequest(line string) (FaultRequest, error) {
	if len(line) > MaxFaultControlLine {
		return FaultRequest{}, fmt.Errorf("request of %d bytes, longer than %d", len(line), MaxFaultControlLine)
	}
	for _, r := range line {
		if r < ' ' && r != '\t' || r == 0x7f {
			return FaultRequest{}, fmt.Errorf("control character %q in the request", r)
		}
	}
	words, err := splitFaultWords(line)
	if err != nil {
		return FaultRequest{}, err
	}
	if len(words) == 0 {
		return FaultRequest{}, errors.New("empty request")
	}
	head := words[0]
	switch head.value {
	case "release", "clear", "status":
		if head.key != "" || len(words) > 1 {
			return FaultRequest{}, fmt.Errorf("%s takes no arguments", head.text)
		}
		return FaultRequest{Op: head.value}, nil
	}
	kind, ok := faultKinds[head.value]
	if head.key != "" || !ok {
		return FaultRequest{}, fmt.Errorf("unknown request %q: want a fault kind (fail, garbage, drop-before-exec, drop-after-exec, hang, late), release, clear or status", head.text)
	}
	f := Fault{Kind: kind, Nth: 1, Count: 1}
	seen := map[string]bool{}
	for _, w := range words[1:] {
		if w.key == "" {
			return FaultRequest{}, fmt.Errorf("%q: want key=value", w.text)
		}
		if seen[w.key] {
			return FaultRequest{}, fmt.Errorf("%s given twice", w.key)
		}
		seen[w.key] = true
		switch w.key {
		case "nth":
			if f.Nth, err = faultInt(w, maxFaultNth); err != nil {
				return FaultRequest{}, err
			}
		case "count":
			if w.value == "all" {
				f.Count = -1
			} else if f.Count, err = faultInt(w, maxFaultCount); err != nil {
				return FaultRequest{}, fmt.Errorf("%w, or all", err)
			}
		case "match":
			if f.Match, err = faultText(w); err != nil {
				return FaultRequest{}, err
			}
		case "output":
			if kind != FaultFail && kind != FaultGarbage {
				return FaultRequest{}, fmt.Errorf("output applies to fail and garbage, not %s", kind)
			}
			if f.Output, err = faultText(w); err != nil {
				return FaultRequest{}, err
			}
		case "delay":
			if kind != FaultLate {
				return FaultRequest{}, fmt.Errorf("delay applies to late, not %s", kind)
			}
			d, err := time.ParseDuration(w.value)
			if err != nil || d <= 0 || d > maxFaultDelay {
				return FaultRequest{}, fmt.Errorf("delay=%s: want a duration above 0 and at most %s, like 6s (without delay: held until release)", w.value, maxFaultDelay)
			}
			f.Delay = d
		default:
			return FaultRequest{}, fmt.Errorf("unknown key %q: want nth, match, count, delay (late) or output (fail, garbage)", w.key)
		}
	}
	return FaultRequest{Op: "arm", Fault: f}, nil
}

// faultWord is one word of a request: key=value, or a bare value.
type faultWord struct {
	text       string // as written
	key, value string // value unquoted
	quoted     bool
}

// splitFaultWords splits a request at spaces and tabs; a value may be a
// Go string literal with spaces inside.
func splitFaultWords(line string) ([]faultWord, error) {
	var out []faultWord
	rest := line
	for {
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			return out, nil
		}
		var w faultWord
		end := strings.IndexAny(rest, " \t\"")
		if end < 0 {
			end = len(rest)
		}
		if i := strings.IndexByte(rest[:end], '='); i >= 0 {
			w.key = rest[:i]
			if w.key == "" {
				return nil, fmt.Errorf("%q: empty key", firstWord(rest))
			}
			rest = rest[i+1:]
		} else if end < len(rest) && rest[end] == '"' {
			return nil, fmt.Errorf("%q: a quoted text is a value, after key=", firstWord(rest))
		}
		if strings.HasPrefix(rest, `"`) {
			lit, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return nil, fmt.Errorf("%q: unterminated or invalid quoted text", firstWord(rest))
			}
			if w.value, err = strconv.Unquote(lit); err != nil {
				return nil, fmt.Errorf("%q: %v", lit, err)
			}
			w.quoted = true
			rest = rest[len(lit):]
			if rest != "" && rest[0] != ' ' && rest[0] != '\t' {
				return nil, fmt.Errorf("%q: text after a closing quote", firstWord(rest))
			}
		} else {
			end := strings.IndexAny(rest, " \t")
			if end < 0 {
				end = len(rest)
			}
			w.value = rest[:end]
			if strings.ContainsAny(w.value, `"\`) {
				return nil, fmt.Errorf("%q: a value with a quote or a backslash must be quoted as a whole", w.value)
			}
			rest = rest[end:]
		}
		w.text = w.key
		if w.key != "" {
			w.text += "="
		}
		if w.quoted {
			w.text += strconv.Quote(w.value)
		} else {
			w.text += w.value
		}
		out = append(out, w)
	}
}

func firstWord(s string) string {
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		return s[:i]
	}
	return s
}

func faultInt(w faultWord, max int) (int, error) {
	n, err := strconv.Atoi(w.value)
	if err != nil || n < 1 || n > max || w.quoted {
		return 0, fmt.Errorf("%s=%s: want a whole number from 1 to %d", w.key, w.value, max)
	}
	return n, nil
}

func faultText(w faultWord) (string, error) {
	switch {
	case w.value == "":
		return "", fmt.Errorf("%s is empty", w.key)
	case len(w.value) > maxFaultText:
		return "", fmt.Errorf("%s is %d bytes, longer than %d", w.key, len(w.value), maxFaultText)
	case strings.ContainsFunc(w.value, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return "", fmt.Errorf("%s contains a control character", w.key)
	}
	return w.value, nil
}

// String renders a fault as a request line ParseFaultRequest accepts.
func (f Fault) String() string {
	var b strings.Builder
	b.WriteString(f.Kind.String())
	if f.Nth > 1 {
		fmt.Fprintf(&b, " nth=%d", f.Nth)
	}
	if f.Match != "" {
		b.WriteString(" match=" + strconv.Quote(f.Match))
	}
	switch {
	case f.Count < 0:
		b.WriteString(" count=all")
	case f.Count > 1:
		fmt.Fprintf(&b, " count=%d", f.Count)
	}
	if f.Delay > 0 {
		b.WriteString(" delay=" + f.Delay.String())
	}
	if f.Output != "" {
		b.WriteString(" output=" + strconv.Quote(f.Output))
	}
	return b.String()
}

// Control applies one request of the fault control protocol and returns
// its answer line (without the newline).
func (s *Server) Control(line string) string {
	if answer, ok := s.ControlHardware(line); ok { // drive, smart, io: hardware.go
		return answer
	}
	req, err := ParseFaultRequest(line)
	if err != nil {
		return "error: " + err.Error()
	}
	switch req.Op {
	case "release":
		return fmt.Sprintf("ok released=%d", s.ReleaseLate())
	case "clear":
		s.ClearFaults()
		return "ok"
	case "status":
		return fmt.Sprintf("ok armed=%d held=%d", s.PendingFaults(), s.HeldCommands())
	}
	s.InjectFault(req.Fault)
	s.log.Info("fault armed", "fault", req.Fault.String())
	return "ok armed " + req.Fault.String()
}

// ServeFaultControl answers fault control requests (see the top of this
// file) on every connection l accepts, until l is closed; then it closes
// the connections and returns l's Accept error. Whoever can connect to l
// steers the simulator: listen on a unix socket only its user can reach.
func (s *Server) ServeFaultControl(l net.Listener) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	for {
		c, err := l.Accept()
		if err != nil {
			mu.Lock()
			for c := range conns {
				c.Close()
			}
			mu.Unlock()
			wg.Wait()
			return err
		}
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveFaultControlConn(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		}()
	}
}

func (s *Server) serveFaultControlConn(c net.Conn) {
	defer c.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-s.ctx.Done():
			c.Close()
		case <-stop:
		}
	}()
	r := bufio.NewReaderSize(c, MaxFaultControlLine+2)
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			fmt.Fprintf(c, "error: request longer than %d bytes\n", MaxFaultControlLine)
			return
		}
		if err != nil && (err != io.EOF || len(line) == 0) {
			return
		}
		text := strings.TrimSuffix(strings.TrimSuffix(string(line), "\n"), "\r")
		if _, werr := fmt.Fprintln(c, s.Control(text)); werr != nil || err != nil {
			return
		}
	}
}
