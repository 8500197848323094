package rdssim

import (
	"bufio"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// swapHost is a compare-and-swap of d1's allowed host, as the driver's
// SwapExport sends it: it matches nothing once the host is not from.
func swapHost(from, to string) string {
	return `/disk set [find where slot="d1" and nvme-tcp-server-allow-host-name="` + from + `" and nvme-tcp-export=yes] nvme-tcp-server-allow-host-name="` + to + `"`
}

func allowHost(t *testing.T, s *Server, slot string) string {
	t.Helper()
	for _, d := range s.Disks() {
		if d.Slot == slot {
			return d.AllowHostName
		}
	}
	t.Fatalf("no disk %s", slot)
	return ""
}

// exportSeqs are the command numbers in the export log, in order.
func exportSeqs(s *Server) []int {
	var out []int
	for _, c := range s.ExportLog() {
		out = append(out, c.Seq)
	}
	return out
}

// A late command whose client gave up lands when released, after a later
// command, and as a compare-and-swap then matches nothing: the later
// command's change stands.
func TestLateLandsAfterLaterCommands(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("d1", "1G")) // seq 1: open to any host
	ts.srv.LateNth(1, "/disk set", 0)
	sess := startHung(t, ts, ts.client, swapHost("", simHostA)) // seq 2, held
	sess.Close()                                                // the client's timeout
	if n := ts.srv.HeldCommands(); n != 1 {
		t.Fatalf("%d commands held, want 1", n)
	}
	ts.mustRun(swapHost("", simHostB)) // seq 3: moves on
	if e := ts.srv.Commands()[1]; e.Executed || e.Fault != FaultLate {
		t.Fatalf("held command %+v: ran before its release", e)
	}
	if n := ts.srv.ReleaseLate(); n != 1 {
		t.Errorf("released %d, want 1", n)
	}
	// ReleaseLate returns once the command landed.
	e := ts.srv.Commands()[1]
	if !e.Executed || e.Result != "" {
		t.Errorf("released command %+v: want run, printing nothing", e)
	}
	if got := allowHost(t, ts.srv, "d1"); got != simHostB {
		t.Errorf("allowed host %q after the late swap landed, want %q (it must match nothing)", got, simHostB)
	}
	if got := exportSeqs(ts.srv); !slices.Equal(got, []int{1, 3}) {
		t.Errorf("export log by command %v, want [1 3]: the late command changed nothing; %+v", got, ts.srv.ExportLog())
	}
	if n := ts.srv.HeldCommands(); n != 0 {
		t.Errorf("%d commands still held", n)
	}
	if n := ts.srv.ReleaseLate(); n != 0 {
		t.Errorf("second release: %d, want 0", n)
	}
}

// A late command that still matches when it lands takes effect then,
// after the commands that ran meanwhile, and its client, still waiting,
// gets the reply.
func TestLateTakesEffectWhenItLands(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("d1", "1G"))
	ts.mustRun(addCmd("d2", "1G"))
	ts.srv.InjectFault(Fault{Kind: FaultLate, Match: `slot="d1"`})
	sess := startHung(t, ts, ts.client, swapHost("", simHostA)) // seq 3, held
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()
	ts.mustRun(`/disk set [find slot="d2"] nvme-tcp-server-allow-host-name="` + simHostB + `"`) // seq 4
	ts.srv.ReleaseLate()
	if err := <-done; err != nil {
		t.Fatalf("the waiting client: %v", err)
	}
	if got := allowHost(t, ts.srv, "d1"); got != simHostA {
		t.Errorf("d1 allowed host %q, want %q", got, simHostA)
	}
	if got := exportSeqs(ts.srv); !slices.Equal(got, []int{1, 2, 4, 3}) {
		t.Errorf("export log by command %v, want [1 2 4 3] (the late one last)", got)
	}
	if e := ts.srv.Commands()[2]; !e.Executed || e.Fault != FaultLate {
		t.Errorf("log entry %+v", e)
	}
}

// With a delay, a late command lands by itself, also with its client
// (and its connection) gone.
func TestLateDelayLandsWithClientGone(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("d1", "1G"))
	ts.srv.LateNth(1, "", 50*time.Millisecond)
	c, err := ts.dial(ts.signer)
	if err != nil {
		t.Fatal(err)
	}
	startHung(t, ts, c, swapHost("", simHostA))
	c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for ts.srv.HeldCommands() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the late command never landed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := allowHost(t, ts.srv, "d1"); got != simHostA {
		t.Errorf("allowed host %q, want %q", got, simHostA)
	}
	if e := ts.srv.Commands()[1]; !e.Executed {
		t.Errorf("log entry %+v", e)
	}
}

// count=all holds every matching command; a release lands those held
// before it, and a command held after it waits for the next one; Close
// discards what is still held, unrun.
func TestLateBatchesAndClose(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("d1", "1G"))
	ts.srv.InjectFault(Fault{Kind: FaultLate, Match: "allow-host-name", Count: -1})
	s1 := startHung(t, ts, ts.client, swapHost("", simHostA))
	s2 := startHung(t, ts, ts.client, swapHost(simHostA, simHostB))
	defer s1.Close()
	defer s2.Close()
	if n := ts.srv.ReleaseLate(); n != 2 {
		t.Errorf("released %d, want 2", n)
	}
	if got := allowHost(t, ts.srv, "d1"); got != simHostA && got != simHostB {
		t.Errorf("allowed host %q after both landed", got)
	}
	s3 := startHung(t, ts, ts.client, swapHost("x", "y"))
	defer s3.Close()
	if n := ts.srv.HeldCommands(); n != 1 {
		t.Errorf("%d held after the release, want 1 (the new one)", n)
	}
	ts.srv.Close()
	if n := ts.srv.HeldCommands(); n != 0 {
		t.Errorf("%d held after Close", n)
	}
	if e := ts.srv.Commands()[3]; e.Executed {
		t.Errorf("a command held at Close ran: %+v", e)
	}
	if n := ts.srv.ReleaseLate(); n != 0 {
		t.Errorf("release after Close: %d", n)
	}
}

func TestParseFaultRequest(t *testing.T) {
	for _, tc := range []struct {
		line string
		want FaultRequest
	}{
		{`late match=set delay=6s count=1`, FaultRequest{Op: "arm", Fault: Fault{Kind: FaultLate, Nth: 1, Count: 1, Match: "set", Delay: 6 * time.Second}}},
		{`late match="nvme-tcp-export=no] nvme-tcp-export=yes" count=all`, FaultRequest{Op: "arm", Fault: Fault{Kind: FaultLate, Nth: 1, Count: -1, Match: "nvme-tcp-export=no] nvme-tcp-export=yes"}}},
		{"  fail\tnth=2 output=\"failure: no \\\"space\\\"\"  ", FaultRequest{Op: "arm", Fault: Fault{Kind: FaultFail, Nth: 2, Count: 1, Output: `failure: no "space"`}}},
		{`late match="slot=\"pvc-1\""`, FaultRequest{Op: "arm", Fault: Fault{Kind: FaultLate, Nth: 1, Count: 1, Match: `slot="pvc-1"`}}},
		{`hang`, FaultRequest{Op: "arm", Fault: Fault{Kind: FaultHang, Nth: 1, Count: 1}}},
		{`drop-after-exec count=3 match=add`, FaultRequest{Op: "arm", Fault: Fault{Kind: FaultDropAfterExec, Nth: 1, Count: 3, Match: "add"}}},
		{`release`, FaultRequest{Op: "release"}},
		{`clear`, FaultRequest{Op: "clear"}},
		{` status `, FaultRequest{Op: "status"}},
	} {
		got, err := ParseFaultRequest(tc.line)
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v, %v; want %+v", tc.line, got, err, tc.want)
			continue
		}
		if got.Op != "arm" {
			continue
		}
		again, err := ParseFaultRequest(got.Fault.String())
		if err != nil || again != got {
			t.Errorf("%q: String %q parses as %+v, %v", tc.line, got.Fault.String(), again, err)
		}
	}
	for _, tc := range []struct{ line, want string }{
		{``, "empty request"},
		{`   `, "empty request"},
		{`slow match=x`, "unknown request"},
		{`none`, "unknown request"},
		{`late=1`, "unknown request"},
		{`late match=x match=y`, "match given twice"},
		{`late frob=1`, `unknown key "frob"`},
		{`late delay=0s`, "delay=0s: want a duration above 0"},
		{`late delay=-1s`, "want a duration above 0"},
		{`late delay=2h`, "at most 1h0m0s"},
		{`late delay=soon`, "delay=soon"},
		{`fail delay=1s`, "delay applies to late, not fail"},
		{`late output=x`, "output applies to fail and garbage, not late"},
		{`late nth=0`, "nth=0: want a whole number from 1"},
		{`late nth=1x`, "nth=1x"},
		{`late nth="2"`, "nth=2: want a whole number"},
		{`late count=-1`, "count=-1"},
		{`late count=0`, "count=0"},
		{`late count=1000001`, "from 1 to 1000000, or all"},
		{`late match=`, "match is empty"},
		{`late match=""`, "match is empty"},
		{`late match="x`, "unterminated or invalid quoted text"},
		{`late match="x"y`, "text after a closing quote"},
		{`late match=a"b`, "must be quoted as a whole"},
		{`late match=a\b`, "must be quoted as a whole"},
		{`late "x"`, "a quoted text is a value"},
		{`late =x`, "empty key"},
		{`late nth`, `"nth": want key=value`},
		{`late match="a\nb"`, "match contains a control character"},
		{"late match=a\x00b", "control character"},
		{"late match=" + strings.Repeat("x", 1025), "longer than 1024"},
		{"late match=" + strings.Repeat("x", MaxFaultControlLine), "longer than 4096"},
		{`release now`, "release takes no arguments"},
		{`status=1`, "unknown request"},
	} {
		got, err := ParseFaultRequest(tc.line)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %+v, %v; want an error with %q", tc.line, got, err, tc.want)
		}
	}
}

// The fault control socket arms a late fault, reports what it holds,
// releases it, and refuses bad requests without closing the connection.
func TestServeFaultControl(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("d1", "1G"))
	sock := filepath.Join(t.TempDir(), "faults.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- ts.srv.ServeFaultControl(l) }()
	defer func() {
		l.Close()
		<-served
	}()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	ask := func(line string) string {
		t.Helper()
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		a, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return strings.TrimSuffix(a, "\n")
	}
	for _, step := range []struct{ req, want string }{
		{`late match="allow-host-name=\"\"" count=1`, `ok armed late match="allow-host-name=\"\""`},
		{`late delay=-1s`, "error: delay=-1s"},
		{`status`, "ok armed=1 held=0"},
	} {
		if got := ask(step.req); !strings.HasPrefix(got, step.want) {
			t.Fatalf("%q: answered %q, want %q...", step.req, got, step.want)
		}
	}
	sess := startHung(t, ts, ts.client, swapHost("", simHostA))
	defer sess.Close()
	if got := ask("status"); got != "ok armed=0 held=1" {
		t.Errorf("status with one held: %q", got)
	}
	if got := ask("release"); got != "ok released=1" {
		t.Errorf("release: %q", got)
	}
	if got := allowHost(t, ts.srv, "d1"); got != simHostA {
		t.Errorf("allowed host %q after release", got)
	}
	if got := ask("clear"); got != "ok" {
		t.Errorf("clear: %q", got)
	}
	// A request longer than the limit ends the connection after the error.
	if _, err := c.Write([]byte(strings.Repeat("x", MaxFaultControlLine+10) + "\n")); err != nil {
		t.Fatal(err)
	}
	if a, _ := r.ReadString('\n'); !strings.HasPrefix(a, "error: request longer than") {
		t.Errorf("over-long request: %q", a)
	}
	if _, err := r.ReadString('\n'); err == nil {
		t.Error("the connection stayed open after an over-long request")
	}
}
