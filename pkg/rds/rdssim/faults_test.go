package rdssim

import (
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func TestFaults(t *testing.T) {
	type step struct {
		cmd      string
		want     string // reply; ignored when dropped
		dropped  bool   // the connection is lost instead of a reply
		fault    FaultKind
		executed bool
	}
	const (
		printB = `/disk print detail where slot="b"`
		boom   = "failure: boom"
	)
	addA, addB, addC := addCmd("a", "1G"), addCmd("b", "1G"), addCmd("c", "1G")
	ok := func(cmd string) step { return step{cmd: cmd, executed: true} }
	for _, tc := range []struct {
		name      string
		inject    func(s *Server)
		steps     []step
		wantDisks []string
	}{
		{
			name:   "fail the 2nd command",
			inject: func(s *Server) { s.FailNth(2, "", boom) },
			steps: []step{
				ok(addA),
				{cmd: addB, want: boom + "\n", fault: FaultFail},
				ok(addC),
			},
			wantDisks: []string{"a", "c"},
		},
		{
			name:   "fail the next matching command with the default text",
			inject: func(s *Server) { s.FailNth(1, "/disk add", "") },
			steps: []step{
				ok(printB),
				{cmd: addB, want: DefaultFailure + "\n", fault: FaultFail},
				ok(addB),
			},
			wantDisks: []string{"b"},
		},
		{
			name:   "only matching commands count",
			inject: func(s *Server) { s.FailNth(2, `slot="b"`, "failure: not enough space") },
			steps: []step{
				ok(addA),
				ok(printB),
				{cmd: addB, want: "failure: not enough space\n", fault: FaultFail},
				ok(addB),
			},
			wantDisks: []string{"a", "b"},
		},
		{
			name:   "garbage after running the command",
			inject: func(s *Server) { s.GarbageNth(1, "add") },
			steps: []step{
				{cmd: addA, want: DefaultGarbage, fault: FaultGarbage, executed: true},
				ok(printB),
			},
			wantDisks: []string{"a"},
		},
		{
			name:   "custom garbage",
			inject: func(s *Server) { s.InjectFault(Fault{Kind: FaultGarbage, Nth: 2, Output: "Flags: X\n 0 X size=12 34"}) },
			steps: []step{
				ok(printB),
				{cmd: printB, want: "Flags: X\n 0 X size=12 34", fault: FaultGarbage, executed: true},
			},
		},
		{
			name:   "drop before exec",
			inject: func(s *Server) { s.DropBeforeExecNth(1, "add") },
			steps: []step{
				ok(printB),
				{cmd: addB, dropped: true, fault: FaultDropBeforeExec},
				ok(printB),
			},
			wantDisks: nil,
		},
		{
			name:   "drop after exec",
			inject: func(s *Server) { s.DropAfterExecNth(1, "add") },
			steps: []step{
				{cmd: addB, dropped: true, fault: FaultDropAfterExec, executed: true},
				{cmd: addB, want: "failure: disk with such slot already exists\n", executed: true},
			},
			wantDisks: []string{"b"},
		},
		{
			name:   "repeat until cleared",
			inject: func(s *Server) { s.InjectFault(Fault{Kind: FaultFail, Match: "add", Count: -1}) },
			steps: []step{
				{cmd: addA, want: DefaultFailure + "\n", fault: FaultFail},
				ok(printB),
				{cmd: addB, want: DefaultFailure + "\n", fault: FaultFail},
				{cmd: addC, want: DefaultFailure + "\n", fault: FaultFail},
			},
		},
		{
			name:   "count two from the second",
			inject: func(s *Server) { s.InjectFault(Fault{Kind: FaultFail, Nth: 2, Count: 2, Output: boom}) },
			steps: []step{
				ok(addA),
				{cmd: addB, want: boom + "\n", fault: FaultFail},
				{cmd: addB, want: boom + "\n", fault: FaultFail},
				ok(addB),
				ok(addC),
			},
			wantDisks: []string{"a", "b", "c"},
		},
		{
			name: "two faults on one command: the first injected wins, the other waits",
			inject: func(s *Server) {
				s.FailNth(1, "", boom)
				s.GarbageNth(1, "")
			},
			steps: []step{
				{cmd: addA, want: boom + "\n", fault: FaultFail},
				{cmd: addA, want: DefaultGarbage, fault: FaultGarbage, executed: true},
				{cmd: addB, executed: true},
			},
			wantDisks: []string{"a", "b"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := startSim(t, nil)
			tc.inject(ts.srv)
			for i, st := range tc.steps {
				out, err := ts.tryRun(st.cmd)
				if st.dropped {
					if err == nil {
						t.Fatalf("step %d %s: got reply %q, want a dropped connection", i, st.cmd, out)
					}
					ts.redial()
					continue
				}
				if err != nil {
					t.Fatalf("step %d %s: %v", i, st.cmd, err)
				}
				if st.cmd == printB && st.fault == FaultNone {
					continue // its output depends on the step before
				}
				if out != st.want {
					t.Errorf("step %d %s: got %q, want %q", i, st.cmd, out, st.want)
				}
			}
			if n := ts.srv.PendingFaults(); n != 0 && tc.name != "repeat until cleared" {
				t.Errorf("%d faults still armed", n)
			}
			log := ts.srv.Commands()
			if len(log) != len(tc.steps) {
				t.Fatalf("command log has %d entries, want %d: %+v", len(log), len(tc.steps), log)
			}
			for i, st := range tc.steps {
				e := log[i]
				if e.Text != st.cmd || e.Fault != st.fault || e.Executed != st.executed || e.Seq != i+1 || e.User != "admin" {
					t.Errorf("log[%d] = %+v, want command %q fault %v executed %v", i, e, st.cmd, st.fault, st.executed)
				}
				if st.dropped && e.Output != "" {
					t.Errorf("log[%d]: output %q for a dropped command", i, e.Output)
				}
			}
			var slots []string
			for _, d := range ts.srv.Disks() {
				slots = append(slots, d.Slot)
			}
			if !slices.Equal(slots, tc.wantDisks) {
				t.Errorf("disks %v, want %v", slots, tc.wantDisks)
			}
		})
	}
}

func TestClearFaults(t *testing.T) {
	ts := startSim(t, nil)
	ts.srv.InjectFault(Fault{Kind: FaultFail, Count: -1})
	if got := ts.run(addCmd("a", "1G")); got != DefaultFailure+"\n" {
		t.Fatalf("got %q", got)
	}
	ts.srv.ClearFaults()
	if n := ts.srv.PendingFaults(); n != 0 {
		t.Errorf("%d faults armed after ClearFaults", n)
	}
	ts.mustRun(addCmd("a", "1G"))
}

// startHung starts cmd on a new session and returns once the simulator has
// logged it: the exec request is answered only after that.
func startHung(t *testing.T, ts *testSim, client *ssh.Client, cmd string) *ssh.Session {
	t.Helper()
	sess, err := client.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Start(cmd); err != nil {
		t.Fatal(err)
	}
	log := ts.srv.Commands()
	if len(log) == 0 || log[len(log)-1].Text != cmd {
		t.Fatalf("command not logged after Start: %+v", log)
	}
	return sess
}

func TestHang(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(s *Server)
		fault FaultKind
	}{
		{"hang fault", func(s *Server) { s.HangNth(1, "add") }, FaultHang},
		{"latency", func(s *Server) { s.SetLatency(time.Hour) }, FaultNone},
	} {
		t.Run(tc.name+"/client closes the session", func(t *testing.T) {
			ts := startSim(t, nil)
			tc.setup(ts.srv)
			sess := startHung(t, ts, ts.client, addCmd("a", "1G"))
			sess.Close()
			if err := sess.Wait(); err == nil {
				t.Error("a hung command completed")
			}
			ts.srv.SetLatency(0)
			// The connection still works, and the command never ran.
			if out := ts.run(`/disk print detail where slot="a"`); out != diskLegendLine {
				t.Errorf("hung command ran:\n%s", out)
			}
			if e := ts.srv.Commands()[0]; e.Executed || e.Output != "" || e.Fault != tc.fault {
				t.Errorf("log entry %+v", e)
			}
		})
		t.Run(tc.name+"/client drops the connection", func(t *testing.T) {
			ts := startSim(t, nil)
			tc.setup(ts.srv)
			c, err := ts.dial(ts.signer)
			if err != nil {
				t.Fatal(err)
			}
			sess := startHung(t, ts, c, addCmd("a", "1G"))
			c.Close()
			if err := sess.Wait(); err == nil {
				t.Error("a hung command completed")
			}
			ts.srv.SetLatency(0)
			if out := ts.run(`/disk print detail where slot="a"`); out != diskLegendLine {
				t.Errorf("hung command ran:\n%s", out)
			}
		})
		t.Run(tc.name+"/server closes", func(t *testing.T) {
			ts := startSim(t, nil)
			tc.setup(ts.srv)
			sess := startHung(t, ts, ts.client, addCmd("a", "1G"))
			ts.srv.Close() // must not wait for the hung command
			if err := sess.Wait(); err == nil {
				t.Error("a hung command completed")
			}
		})
	}
}

func TestConfigLatency(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.Latency = time.Millisecond })
	ts.mustRun(addCmd("a", "1G"))
	ts.srv.SetLatency(0)
	if out := ts.run(`/disk print detail where slot="a"`); !strings.Contains(out, `slot="a"`) {
		t.Errorf("print: %q", out)
	}
}

func TestRefuseConnections(t *testing.T) {
	ts := startSim(t, nil)
	ts.srv.SetRefuseConnections(true)
	if c, err := ts.dial(ts.signer); err == nil {
		c.Close()
		t.Fatal("connected while refusing")
	}
	// A connection made before keeps working.
	if out := ts.run("/system resource print"); !strings.Contains(out, "board-name: RDS2216") {
		t.Errorf("existing connection: %q", out)
	}
	ts.srv.SetRefuseConnections(false)
	ts.redial()
	ts.run("/system resource print")
	if st := ts.srv.Stats(); st.Refused != 1 || st.Accepted != 2 || st.Commands != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestCommandLog(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("a", "1G"))
	out := ts.run(`/disk print detail where slot="a"`)
	ts.run(`/disk frob`)
	log := ts.srv.Commands()
	want := []Command{
		{Seq: 1, User: "admin", Text: addCmd("a", "1G"), Executed: true},
		{Seq: 2, User: "admin", Text: `/disk print detail where slot="a"`, Output: out, Result: out, Executed: true},
		{Seq: 3, User: "admin", Text: `/disk frob`, Output: "bad command name frob (line 1 column 7)\n", Result: "bad command name frob (line 1 column 7)\n", Executed: true},
	}
	if !slices.Equal(log, want) {
		t.Errorf("log:\n%+v\nwant:\n%+v", log, want)
	}
	ts.srv.ResetCommands()
	if n := len(ts.srv.Commands()); n != 0 {
		t.Errorf("%d entries after reset", n)
	}
	ts.run("/system resource print")
	if log := ts.srv.Commands(); len(log) != 1 || log[0].Seq != 4 {
		t.Errorf("after reset: %+v", log)
	}
}

func TestFaultKindString(t *testing.T) {
	for k, want := range map[FaultKind]string{
		FaultNone: "none", FaultFail: "fail", FaultGarbage: "garbage",
		FaultDropBeforeExec: "drop-before-exec", FaultDropAfterExec: "drop-after-exec",
		FaultHang: "hang", FaultLate: "late", FaultKind(99): "unknown",
	} {
		if got := k.String(); got != want {
			t.Errorf("%d: %q, want %q", k, got, want)
		}
	}
}
