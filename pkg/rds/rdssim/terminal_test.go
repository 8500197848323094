package rdssim

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

func TestLoginOptions(t *testing.T) {
	for _, tc := range []struct {
		login, user string
		width       int
	}{
		{"admin", "admin", 0},
		{"admin+ct511w4098h", "admin", 511},
		{"admin+c80w", "admin", 80},
		{"admin+ct", "admin", 0},
		{"admin+w", "admin", 0}, // implicit value: auto
		{"admin+0w", "admin+0w", 0},
		{"admin+ct511", "admin+ct511", 0},
		{"ad+min!", "ad+min!", 0},
	} {
		if user, width := loginOptions(tc.login); user != tc.user || width != tc.width {
			t.Errorf("loginOptions(%q) = %q, %d; want %q, %d", tc.login, user, width, tc.user, tc.width)
		}
	}
}

const longSlot = "pvc-3f2c1a2b-5d4e-4f60-9120-464c8a7b9d0e"

func longPath() string { return "/storage-pool/kubernetes-volumes/" + longSlot + ".img" }

func addLong(ts *testSim) {
	ts.t.Helper()
	ts.mustRun(`/disk add type=file file-path="` + longPath() + `" file-size=1G slot="` + longSlot + `" nvme-tcp-export=yes nvme-tcp-server-port=4420 nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:` + longSlot + `"`)
}

// runAs runs one command on a new connection logged in as login.
func (ts *testSim) runAs(login, cmd string) (string, error) {
	ts.t.Helper()
	c, err := ssh.Dial("tcp", ts.srv.Addr(), &ssh.ClientConfig{
		User: login, Auth: []ssh.AuthMethod{ssh.PublicKeys(ts.signer)},
		HostKeyCallback: ssh.FixedHostKey(ts.srv.HostPublicKey()),
	})
	if err != nil {
		ts.t.Fatal(err)
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		ts.t.Fatal(err)
	}
	defer sess.Close()
	out, err := sess.CombinedOutput(cmd)
	return string(out), err
}

func longestLine(s string) int {
	n := 0
	for _, l := range strings.Split(s, "\n") {
		n = max(n, len(l))
	}
	return n
}

// TestWrapsLikeHardware: by default print output wraps at 80 columns and a
// value longer than a line is broken in the middle, the rest on the next
// indented line; a login name's width option changes the width.
func TestWrapsLikeHardware(t *testing.T) {
	ts := startSim(t, nil)
	addLong(ts)
	cmd := `/disk print detail where slot="` + longSlot + `"`

	out := ts.run(cmd)
	if n := longestLine(out); n != DefaultTerminalWidth {
		t.Errorf("longest line %d, want %d:\n%s", n, DefaultTerminalWidth, out)
	}
	nqn := `nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:` + longSlot + `"`
	if strings.Contains(out, nqn) {
		t.Errorf("the 87-character NQN property was not broken:\n%s", out)
	}
	if !strings.Contains(strings.ReplaceAll(out, "\n      ", ""), nqn) {
		t.Errorf("the NQN does not continue on the next indented line:\n%s", out)
	}

	for _, tc := range []struct {
		login   string
		longest int
	}{
		{"admin+ct511w4098h", 0}, // no line broken: each is shorter than 511
		{"admin+60w", 60},
	} {
		out, err := ts.runAs(tc.login, cmd)
		if err != nil {
			t.Fatal(err)
		}
		n := longestLine(out)
		switch {
		case tc.longest > 0 && n != tc.longest:
			t.Errorf("%s: longest line %d, want %d:\n%s", tc.login, n, tc.longest, out)
		case tc.longest == 0 && (!strings.Contains(out, nqn) || !strings.Contains(out, "file-path="+longPath()+" ")):
			t.Errorf("%s: values broken:\n%s", tc.login, out)
		}
	}
	if got := ts.srv.Commands(); got[len(got)-1].User != "admin" || got[len(got)-1].TerminalWidth != 60 {
		t.Errorf("log entry %+v", got[len(got)-1])
	}
}

// TestLegend: the Flags legend is printed even when nothing matches, and
// runs onto more lines when it is wider than the terminal.
func TestLegend(t *testing.T) {
	ts := startSim(t, nil)
	if out := ts.run(`/disk print detail where slot="nope"`); out != "Flags: "+diskLegend+"\n" {
		t.Errorf("no match: %q", out)
	}
	out, err := ts.runAs("admin+30w", `/disk print detail where slot="nope"`)
	if err != nil {
		t.Fatal(err)
	}
	want := "Flags: B - BLOCK-DEVICE;\n       M - MOUNTED;\n       t - NVME-TCP-EXPORT\n"
	if out != want {
		t.Errorf("narrow legend:\n%q\nwant\n%q", out, want)
	}
	if out := ts.run(`/file print detail where name="nope"`); out != "" {
		t.Errorf("/file has no legend: %q", out)
	}
}

func TestRegexConditions(t *testing.T) {
	ts := startSim(t, func(c *Config) { c.TerminalWidth = -1 })
	ts.mustRun(addCmd("pvc-1", "1G"))
	ts.mustRun(addCmd("pvc-2", "1G"))
	ts.mustRun(copyCmd("snap-1", "pvc-1", ""))
	count := func(out string) int { return strings.Count(out, "type=file ") }
	for _, tc := range []struct {
		cmd  string
		want int
	}{
		{`/disk print detail where slot~"^pvc-"`, 2},
		{`/disk print detail where slot~"snap"`, 1},
		{`/disk print detail where file-path~"k8s/pvc-[0-9]+\.img"`, 0}, // `\.` is not a RouterOS escape
		{`/disk print detail where type=file and slot~"-1$"`, 0},        // `$` in quotes is a variable
		{`/disk print detail where type=file and slot~"-1\$"`, 2},
		{`/disk print detail where slot~"x|pvc-2"`, 1},
	} {
		out := ts.run(tc.cmd)
		if strings.HasPrefix(out, "syntax error") {
			if tc.want != 0 {
				t.Errorf("%s: %q", tc.cmd, out)
			}
			continue
		}
		if got := count(out); got != tc.want {
			t.Errorf("%s: %d disks, want %d:\n%s", tc.cmd, got, tc.want, out)
		}
	}
	ts.mustRun(`/disk remove [find slot~"^snap-"]`)
	if d := ts.srv.Disks(); len(d) != 2 || d[0].Slot != "pvc-1" || d[1].Slot != "pvc-2" {
		t.Errorf("after remove by regex: %+v", d)
	}
	if out := ts.run(`/disk print detail where slot~"("`); out != "failure: invalid regular expression\n" {
		t.Errorf("bad regex: %q", out)
	}
	if out := ts.run(`/disk print detail slot~"a"`); !strings.HasPrefix(out, "expected end of command") {
		t.Errorf("regex outside where: %q", out)
	}
}

func TestExitStatusOnFailure(t *testing.T) {
	for _, on := range []bool{false, true} {
		ts := startSim(t, func(c *Config) { c.ExitStatusOnFailure = on })
		out, err := ts.tryRun(`/disk remove nope`)
		var exit *ssh.ExitError
		switch {
		case out != "failure: no such item\n":
			t.Errorf("on=%v: output %q", on, out)
		case on && (!errors.As(err, &exit) || exit.ExitStatus() != 1):
			t.Errorf("on: err %v, want exit status 1", err)
		case !on && err != nil:
			t.Errorf("off: err %v, want exit status 0", err)
		}
		ts.srv.FailNth(1, "print", "")
		if _, err := ts.tryRun(`/disk print detail`); on != (errors.As(err, &exit) && exit.ExitStatus() == 1) {
			t.Errorf("on=%v: injected failure: err %v", on, err)
		}
		if _, err := ts.tryRun(`/disk print detail`); err != nil {
			t.Errorf("on=%v: success: err %v", on, err)
		}
	}
}
