package rds

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// Storage fencing against the simulator over SSH: SetExportHost and
// CloseExport in every starting state, the exact conditional commands
// they send, and concurrent changes between their steps.

func TestSetExportHostTransitions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from     diskState
		host     string
		drop     bool
		commands []string
		dropped  bool
	}{
		{name: "already exported to the host: nothing sent", from: diskState{true, hostA}, host: hostA, drop: true},
		{name: "already open to any host", from: diskState{true, ""}, host: ""},
		{name: "closed: set the host, then export on", from: diskState{false, ""}, host: hostA, drop: true, commands: []string{
			cond("", "no") + `nvme-tcp-server-allow-host-name="` + hostA + `"`,
			cond(hostA, "no") + `nvme-tcp-export=yes`,
		}},
		{name: "closed with the host already set (an interrupted move): export on only", from: diskState{false, hostA}, host: hostA, drop: true, commands: []string{
			cond(hostA, "no") + `nvme-tcp-export=yes`,
		}},
		{name: "closed, open to any host", from: diskState{false, hostA}, host: "", commands: []string{
			cond(hostA, "no") + `nvme-tcp-server-allow-host-name=""`,
			cond("", "no") + `nvme-tcp-export=yes`,
		}},
		{name: "move to another host, dropping: off, set, on", from: diskState{true, hostA}, host: hostB, drop: true, dropped: true, commands: []string{
			cond(hostA, "yes") + `nvme-tcp-export=no`,
			cond(hostA, "no") + `nvme-tcp-server-allow-host-name="` + hostB + `"`,
			cond(hostB, "no") + `nvme-tcp-export=yes`,
		}},
		{name: "narrow from any host, dropping", from: diskState{true, ""}, host: hostB, drop: true, dropped: true, commands: []string{
			cond("", "yes") + `nvme-tcp-export=no`,
			cond("", "no") + `nvme-tcp-server-allow-host-name="` + hostB + `"`,
			cond(hostB, "no") + `nvme-tcp-export=yes`,
		}},
		{name: "move to another host without dropping: set only", from: diskState{true, hostA}, host: hostB, commands: []string{
			cond(hostA, "yes") + `nvme-tcp-server-allow-host-name="` + hostB + `"`,
		}},
		{name: "narrow from any host without dropping", from: diskState{true, ""}, host: hostB, commands: []string{
			cond("", "yes") + `nvme-tcp-server-allow-host-name="` + hostB + `"`,
		}},
		{name: "widen to any host: set only, never drops", from: diskState{true, hostA}, host: "", drop: true, commands: []string{
			cond(hostA, "yes") + `nvme-tcp-server-allow-host-name=""`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := startSim(t, 10*GiB)
			c := env.client(t, nil)
			env.prepare(t, c, tc.from)
			ch, err := c.SetExportHost(context.Background(), "pvc-a", tc.host, tc.drop)
			if err != nil {
				t.Fatal(err)
			}
			if got := env.setCommands(); strings.Join(got, "\n") != strings.Join(tc.commands, "\n") {
				t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.commands, "\n"))
			}
			if ch.Changed != (len(tc.commands) > 0) || ch.Dropped != tc.dropped || (ch.Gap > 0) != tc.dropped {
				t.Errorf("change = %+v; want changed %v, dropped %v (with a gap)", ch, len(tc.commands) > 0, tc.dropped)
			}
			if ch.Before.Exported != tc.from.exported || ch.Before.AllowHost != tc.from.host || ch.Before.Slot != "pvc-a" {
				t.Errorf("Before = %+v, want %+v", ch.Before, tc.from)
			}
			if got := env.exportState(t, "pvc-a"); got != (diskState{true, tc.host}) {
				t.Errorf("after: %+v", got)
			}
			// Calling again is a no-op.
			env.sim.ResetCommands()
			if again, err := c.SetExportHost(context.Background(), "pvc-a", tc.host, tc.drop); err != nil || again.Changed {
				t.Errorf("repeated SetExportHost = %+v, %v", again, err)
			}
			if got := env.setCommands(); len(got) != 0 {
				t.Errorf("repeated SetExportHost sent %q", got)
			}
		})
	}
}

func TestCloseExportTransitions(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from     diskState
		expect   string
		commands []string
		after    diskState
	}{
		{name: "exported to the expected host: off, then clear the host", from: diskState{true, hostA}, expect: hostA, commands: []string{
			cond(hostA, "yes") + `nvme-tcp-export=no`,
			cond(hostA, "no") + `nvme-tcp-server-allow-host-name=""`,
		}, after: diskState{false, ""}},
		{name: "open to any host, expected: off only", from: diskState{true, ""}, expect: "", commands: []string{
			cond("", "yes") + `nvme-tcp-export=no`,
		}, after: diskState{false, ""}},
		{name: "already closed: nothing sent", from: diskState{false, ""}, expect: hostA, after: diskState{false, ""}},
		{name: "closed with a host kept: nothing sent", from: diskState{false, hostA}, expect: hostA, after: diskState{false, hostA}},
		{name: "exported to another host: not ours", from: diskState{true, hostB}, expect: hostA, after: diskState{true, hostB}},
		{name: "open to any host, another expected: not ours", from: diskState{true, ""}, expect: hostA, after: diskState{true, ""}},
		{name: "exported to a host, any expected: not ours", from: diskState{true, hostA}, expect: "", after: diskState{true, hostA}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := startSim(t, 10*GiB)
			c := env.client(t, nil)
			env.prepare(t, c, tc.from)
			changed, err := c.CloseExport(context.Background(), "pvc-a", tc.expect)
			if err != nil {
				t.Fatal(err)
			}
			if changed != (len(tc.commands) > 0) {
				t.Errorf("changed = %v", changed)
			}
			if got := env.setCommands(); strings.Join(got, "\n") != strings.Join(tc.commands, "\n") {
				t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.commands, "\n"))
			}
			if got := env.exportState(t, "pvc-a"); got != tc.after {
				t.Errorf("after: %+v, want %+v", got, tc.after)
			}
			env.sim.ResetCommands()
			if changed, err := c.CloseExport(context.Background(), "pvc-a", tc.expect); err != nil || changed {
				t.Errorf("repeated CloseExport = %v, %v", changed, err)
			}
			if got := env.setCommands(); len(got) != 0 {
				t.Errorf("repeated CloseExport sent %q", got)
			}
		})
	}
}

// interject runs fn once, right after the first command containing match
// has been answered to c (the Observer runs in the caller's goroutine,
// between two steps of the operation under test).
func interject(match string, fn func()) func(*Config) {
	var once sync.Once
	return func(cfg *Config) {
		cfg.Observer = func(r CommandRecord) {
			if strings.Contains(r.Command, match) {
				once.Do(fn)
			}
		}
	}
}

func TestExportConcurrentChangeIsNotOverwritten(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		from  diskState
		after string // the command of the code under test after which the other replica acts
		// other acts with its own client, as another controller replica or
		// an operator would.
		other func(o *Client) error
		run   func(c *Client) error
		// want is what run must return: ErrExportChanged, or nil.
		want  error
		final diskState
	}{
		{
			name: "moved elsewhere between the off and the set host", from: diskState{true, hostA},
			after: "] nvme-tcp-export=no",
			other: func(o *Client) error { _, err := o.SetExportHost(ctx, "pvc-a", hostC, true); return err },
			run:   func(c *Client) error { _, err := c.SetExportHost(ctx, "pvc-a", hostB, true); return err },
			want:  ErrExportChanged, final: diskState{true, hostC},
		},
		{
			name: "closed by another between the read and the open", from: diskState{true, hostA},
			after: "/disk print",
			other: func(o *Client) error { _, err := o.CloseExport(ctx, "pvc-a", hostA); return err },
			run:   func(c *Client) error { _, err := c.SetExportHost(ctx, "pvc-a", hostB, true); return err },
			want:  ErrExportChanged, final: diskState{false, ""},
		},
		{
			name: "opened for another host between the read and the set host", from: diskState{false, ""},
			after: "/disk print",
			other: func(o *Client) error { _, err := o.SetExportHost(ctx, "pvc-a", hostC, true); return err },
			run:   func(c *Client) error { _, err := c.SetExportHost(ctx, "pvc-a", hostA, true); return err },
			want:  ErrExportChanged, final: diskState{true, hostC},
		},
		{
			name: "widened by an operator before a set without drop", from: diskState{true, hostA},
			after: "/disk print",
			other: func(o *Client) error { _, err := o.SetExportHost(ctx, "pvc-a", "", false); return err },
			run:   func(c *Client) error { _, err := c.SetExportHost(ctx, "pvc-a", hostB, false); return err },
			want:  ErrExportChanged, final: diskState{true, ""},
		},
		{
			// Clearing the host now would open the disk to every host.
			name: "reopened for the same host between the off and the clear", from: diskState{true, hostA},
			after: "] nvme-tcp-export=no",
			other: func(o *Client) error { _, err := o.SetExportHost(ctx, "pvc-a", hostA, true); return err },
			run:   func(c *Client) error { _, err := c.CloseExport(ctx, "pvc-a", hostA); return err },
			want:  ErrExportChanged, final: diskState{true, hostA},
		},
		{
			name: "moved on by another before the close: left alone", from: diskState{true, hostA},
			after: "/disk print",
			other: func(o *Client) error { _, err := o.SetExportHost(ctx, "pvc-a", hostB, true); return err },
			run:   func(c *Client) error { _, err := c.CloseExport(ctx, "pvc-a", hostA); return err },
			want:  nil, final: diskState{true, hostB},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := startSim(t, 10*GiB)
			other := env.client(t, nil)
			env.prepare(t, other, tc.from)
			var otherErr error
			c := env.client(t, interject(tc.after, func() { otherErr = tc.other(other) }))
			err := tc.run(c)
			if otherErr != nil {
				t.Fatalf("the other replica: %v", otherErr)
			}
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if got := env.exportState(t, "pvc-a"); got != tc.final {
				t.Errorf("final %+v, want the other replica's %+v", got, tc.final)
			}
		})
	}
}

// RouterOS may answer a set whose [find] matched nothing with "no such
// item" instead of silence: the sequence stops and the read-back decides.
func TestExportSetAnsweredNoSuchItem(t *testing.T) {
	ctx := context.Background()
	env := startSim(t, 10*GiB)
	other := env.client(t, nil)
	env.prepare(t, other, diskState{true, hostA})
	c := env.client(t, interject("] nvme-tcp-export=no", func() {
		if _, err := other.SetExportHost(ctx, "pvc-a", hostC, true); err != nil {
			t.Error(err)
		}
		env.sim.FailNth(1, `nvme-tcp-server-allow-host-name="`+hostB+`"`, "failure: no such item")
	}))
	_, err := c.SetExportHost(ctx, "pvc-a", hostB, true)
	if !errors.Is(err, ErrExportChanged) || !strings.Contains(err.Error(), hostC) {
		t.Fatalf("got %v, want ErrExportChanged naming %s", err, hostC)
	}
	if n := countCommands(env, cond(hostB, "no")); n != 0 {
		t.Errorf("export on sent %d times after a set matched nothing", n)
	}
	if got := env.exportState(t, "pvc-a"); got != (diskState{true, hostC}) {
		t.Errorf("final %+v", got)
	}
}

func TestExportFailuresPartWay(t *testing.T) {
	ctx := context.Background()
	t.Run("off ran and its reply was lost: not re-sent (its outcome is unknown), a retry completes the move", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, nil)
		env.prepare(t, c, diskState{true, hostA})
		env.sim.DropAfterExecNth(1, "] nvme-tcp-export=no")
		before := len(env.setCommands())
		if _, err := c.SetExportHost(ctx, "pvc-a", hostB, true); !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("SetExportHost with the off's reply lost: %v, want ErrOutcomeUnknown", err)
		}
		if sets := env.setCommands()[before:]; len(sets) != 1 {
			t.Fatalf("%d set commands %q, want the off alone (a conditional set of unknown outcome is not re-sent)", len(sets), sets)
		}
		if _, err := c.SetExportHost(ctx, "pvc-a", hostB, true); err != nil {
			t.Fatalf("retry: %v", err)
		}
		if got := env.exportState(t, "pvc-a"); got != (diskState{true, hostB}) {
			t.Errorf("final %+v", got)
		}
	})
	t.Run("on refused: the export stays off, a retry opens it", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, nil)
		env.prepare(t, c, diskState{true, hostA})
		env.sim.FailNth(1, "] nvme-tcp-export=yes", "failure: simulated failure")
		ch, err := c.SetExportHost(ctx, "pvc-a", hostB, true)
		if !errors.Is(err, ErrCommandFailed) || !ch.Dropped || !strings.Contains(err.Error(), "export is off") {
			t.Fatalf("SetExportHost = %+v, %v", ch, err)
		}
		if got := env.exportState(t, "pvc-a"); got != (diskState{false, hostB}) {
			t.Errorf("after the failure: %+v, want closed", got)
		}
		ch, err = c.SetExportHost(ctx, "pvc-a", hostB, true)
		if err != nil || ch.Dropped || !ch.Changed {
			t.Fatalf("retry = %+v, %v", ch, err)
		}
		if got := env.exportState(t, "pvc-a"); got != (diskState{true, hostB}) {
			t.Errorf("after the retry: %+v", got)
		}
	})
	t.Run("clear refused after the off: closed, host kept, an error", func(t *testing.T) {
		env := startSim(t, 10*GiB)
		c := env.client(t, nil)
		env.prepare(t, c, diskState{true, hostA})
		env.sim.FailNth(1, `nvme-tcp-server-allow-host-name=""`, "failure: simulated failure")
		if _, err := c.CloseExport(ctx, "pvc-a", hostA); !errors.Is(err, ErrCommandFailed) {
			t.Fatalf("CloseExport: %v", err)
		}
		if got := env.exportState(t, "pvc-a"); got != (diskState{false, hostA}) {
			t.Errorf("after the failure: %+v", got)
		}
	})
}

func TestExportRefusals(t *testing.T) {
	ctx := context.Background()
	env := startSim(t, 10*GiB)
	c := env.client(t, nil)
	if _, err := c.SetExportHost(ctx, "pvc-missing", hostA, true); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetExportHost on a missing disk: %v", err)
	}
	if _, err := c.CloseExport(ctx, "pvc-missing", hostA); !errors.Is(err, ErrNotFound) {
		t.Errorf("CloseExport on a missing disk: %v", err)
	}
	// A disk made without an export (a snapshot) has no NQN to open.
	if _, err := c.CreateDisk(ctx, CreateDiskRequest{Slot: "snap-a", FilePath: "/storage-pool/k8s/snap-a.img", Size: GiB}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetExportHost(ctx, "snap-a", hostA, true); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("SetExportHost on a disk without an NQN: %v", err)
	}
	if got := env.setCommands(); len(got) != 0 {
		t.Errorf("sent %q", got)
	}
	env.sim.ResetCommands()
	for _, bad := range []string{"host-a", "nqn.2014-08.org.nvmexpress:uuid:a\" and slot=\"x", "nqn.2014-08.org.nvmexpress:uuid:a]"} {
		if _, err := c.SetExportHost(ctx, "snap-a", bad, true); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("SetExportHost(%q): %v", bad, err)
		}
		if _, err := c.CloseExport(ctx, "snap-a", bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("CloseExport(%q): %v", bad, err)
		}
	}
	if cmds := env.sim.Commands(); len(cmds) != 0 {
		t.Errorf("an invalid host NQN sent %q", cmds[0].Text)
	}
}

func TestCreateClosedExport(t *testing.T) {
	ctx := context.Background()
	env := startSim(t, 10*GiB)
	c := env.client(t, nil)
	r := req("pvc-a", GiB)
	r.Export.Closed = true
	d, err := c.CreateDisk(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if d.Exported || d.Port != 4420 || d.NQN != r.Export.NQN || d.AllowHost != "" {
		t.Fatalf("created %+v: want not exported, with port and NQN", d)
	}
	if n := countCommands(env, "/disk add"); n != 1 || !strings.Contains(env.sim.Commands()[0].Text, "nvme-tcp-export=no nvme-tcp-server-port=4420 nvme-tcp-server-nqn=") {
		t.Errorf("add: %q", env.sim.Commands()[0].Text)
	}
	// A retried create matches whatever the export became since.
	for _, st := range []diskState{{true, hostA}, {false, hostA}, {true, ""}} {
		if err := c.SetAllowedHost(ctx, "pvc-a", st.host); err != nil {
			t.Fatal(err)
		}
		if _, err := c.exec(ctx, "/disk set [find slot=%s] nvme-tcp-export="+yesNo(st.exported), "pvc-a"); err != nil {
			t.Fatal(err)
		}
		again, err := c.CreateDisk(ctx, r)
		if err != nil || again.Exported != st.exported || again.AllowHost != st.host {
			t.Fatalf("retried closed create over %+v = %+v, %v", st, again, err)
		}
	}
	// An open request does not match a closed disk, nor another NQN.
	if _, err := c.SetExportHost(ctx, "pvc-a", hostA, true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CloseExport(ctx, "pvc-a", hostA); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateDisk(ctx, req("pvc-a", GiB)); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("open create over a closed disk: %v", err)
	}
	other := req("pvc-a", GiB)
	other.Export = &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:other", Closed: true}
	if _, err := c.CreateDisk(ctx, other); !errors.Is(err, ErrAlreadyExists) {
		t.Errorf("closed create with another NQN: %v", err)
	}
	// A copy can be made closed too.
	cp, err := c.CopyDisk(ctx, CopyDiskRequest{Slot: "pvc-b", FilePath: "/storage-pool/k8s/pvc-b.img", SourceSlot: "pvc-a",
		Export: &Export{Port: 4420, NQN: "nqn.2000-02.com.mikrotik:pvc-b", Closed: true}})
	if err != nil || cp.Exported || cp.NQN != "nqn.2000-02.com.mikrotik:pvc-b" {
		t.Fatalf("closed copy = %+v, %v", cp, err)
	}
}

// Whatever RouterOS does to established connections when the allowed host
// changes (the simulator's two behaviours), a move with drop=true drops
// them: the fenced host's connection does not survive the move.
func TestExportMoveDropsUnderBothBehaviours(t *testing.T) {
	ctx := context.Background()
	for _, change := range []rdssim.AllowHostChange{rdssim.AllowHostChangeKeep, rdssim.AllowHostChangeDrop} {
		for _, drop := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/drop=%v", change, drop), func(t *testing.T) {
				env := startSimWith(t, 10*GiB, func(c *rdssim.Config) { c.AllowHostChange = change })
				c := env.client(t, nil)
				env.prepare(t, c, diskState{true, hostA})
				before := env.sim.ConnectionDrops("pvc-a")
				if _, err := c.SetExportHost(ctx, "pvc-a", hostB, drop); err != nil {
					t.Fatal(err)
				}
				dropped := env.sim.ConnectionDrops("pvc-a") > before
				// Without drop, the old host's connection survives where
				// RouterOS keeps connections: the caller must not rely on it.
				if want := drop || change == rdssim.AllowHostChangeDrop; dropped != want {
					t.Errorf("connections dropped = %v, want %v", dropped, want)
				}
				if _, err := c.CloseExport(ctx, "pvc-a", hostB); err != nil {
					t.Fatal(err)
				}
				if env.sim.ConnectionDrops("pvc-a") <= before+btoi(dropped) {
					t.Error("CloseExport did not drop the connections")
				}
			})
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
