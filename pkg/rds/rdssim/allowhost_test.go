package rdssim

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// What changes of a disk's allowed host and export do to established
// connections, under both Config.AllowHostChange behaviours: on the nvmet
// backend (a plain directory for configfs; a link removed from a port is
// where nvmet drops the connections) and in the model without a backend.

const (
	simHostA = "nqn.2014-08.org.nvmexpress:uuid:a"
	simHostB = "nqn.2014-08.org.nvmexpress:uuid:b"
	simNQN   = "nqn.2000-02.com.mikrotik:d1"
)

// unlinkEvent is a subsystem taken off a port, with the hosts allowed at
// that moment.
type unlinkEvent struct {
	port, nqn string
	allowed   []string
}

type unlinkLog struct {
	mu     sync.Mutex
	events []unlinkEvent
}

func (l *unlinkLog) take() []unlinkEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.events
	l.events = nil
	return out
}

// startNvmetSimLogged is startNvmetSim with the exporter's unlinks logged.
func startNvmetSimLogged(t *testing.T, root string, change AllowHostChange) (*testSim, *unlinkLog) {
	t.Helper()
	log := &unlinkLog{}
	ts := startSim(t, func(c *Config) {
		e, err := NewNvmetExporter(NvmetConfig{Root: root})
		if err != nil {
			t.Fatal(err)
		}
		e.onUnlink = func(port, nqn string) {
			allowed, _ := dirNames(filepath.Join(root, "subsystems", nqn, "allowed_hosts"))
			log.mu.Lock()
			defer log.mu.Unlock()
			log.events = append(log.events, unlinkEvent{port: port, nqn: nqn, allowed: allowed})
		}
		c.Exporter = e
		c.AllowHostChange = change
	})
	return ts, log
}

func setHost(host string) string {
	return `/disk set [find slot="d1"] nvme-tcp-server-allow-host-name="` + host + `"`
}

func TestAllowHostChangeConnections(t *testing.T) {
	steps := []struct {
		name string
		cmd  string
		// drops under keep and under drop
		keep, drop int
		exported   bool
		host       string
	}{
		{"create, open to any host", addCmd("d1", "1G"), 0, 0, true, ""},
		{"narrow to host A", setHost(simHostA), 0, 1, true, simHostA},
		{"host A again: no change", setHost(simHostA), 0, 0, true, simHostA},
		{"move to host B", setHost(simHostB), 0, 1, true, simHostB},
		{"grow: no host change", `/disk set [find slot="d1"] file-size=2G`, 0, 0, true, simHostB},
		{"conditional set matching nothing", `/disk set [find where slot="d1" and nvme-tcp-server-allow-host-name="` + simHostA + `"] nvme-tcp-server-allow-host-name=""`, 0, 0, true, simHostB},
		{"widen to any host", setHost(""), 0, 1, true, ""},
		{"conditional narrow", `/disk set [find where slot="d1" and nvme-tcp-server-allow-host-name="" and nvme-tcp-export=yes] nvme-tcp-server-allow-host-name="` + simHostA + `"`, 0, 1, true, simHostA},
		{"export off: always drops", `/disk set [find slot="d1"] nvme-tcp-export=no`, 1, 1, false, simHostA},
		{"host changed while off", setHost(simHostB), 0, 0, false, simHostB},
		{"export on again", `/disk set [find slot="d1" and nvme-tcp-server-allow-host-name="` + simHostB + `"] nvme-tcp-export=yes`, 0, 0, true, simHostB},
		{"another port", `/disk set [find slot="d1"] nvme-tcp-server-port=4421`, 1, 1, true, simHostB},
		{"disk removed: always drops", `/disk remove [find slot="d1"]`, 1, 1, false, ""},
	}
	for _, change := range []AllowHostChange{AllowHostChangeKeep, AllowHostChangeDrop} {
		t.Run(string(change)+"/nvmet", func(t *testing.T) {
			root := fakeNvmetRoot(t)
			ts, log := startNvmetSimLogged(t, root, change)
			sub := filepath.Join(root, "subsystems", simNQN)
			total := 0
			for _, st := range steps {
				ts.mustRun(st.cmd)
				want := st.keep
				if change == AllowHostChangeDrop {
					want = st.drop
				}
				total += want
				events := log.take()
				if len(events) != want {
					t.Errorf("%s: %d unlinks from a port, want %d: %+v", st.name, len(events), want, events)
				}
				// A drop for a host change comes after allowed_hosts changed,
				// so the old host cannot reconnect.
				if want == 1 && len(events) == 1 && st.exported && st.host != "" && !slices.Equal(events[0].allowed, []string{st.host}) {
					t.Errorf("%s: allowed_hosts %v at the unlink, want [%s]", st.name, events[0].allowed, st.host)
				}
				port := "4420"
				if strings.Contains(st.name, "another port") || strings.Contains(st.name, "removed") {
					port = "4421"
				}
				linked := exists(filepath.Join(root, "ports", port, "subsystems", simNQN))
				if linked != st.exported {
					t.Errorf("%s: linked to port %s = %v, want %v", st.name, port, linked, st.exported)
				}
				if st.exported {
					hosts, _ := dirNames(filepath.Join(sub, "allowed_hosts"))
					wantHosts, wantAny := []string{}, "1"
					if st.host != "" {
						wantHosts, wantAny = []string{st.host}, "0"
					}
					if !slices.Equal(hosts, wantHosts) || readAttrT(t, filepath.Join(sub, "attr_allow_any_host")) != wantAny {
						t.Errorf("%s: allowed_hosts %v, allow_any_host %s", st.name, hosts, readAttrT(t, filepath.Join(sub, "attr_allow_any_host")))
					}
				}
				if got := ts.srv.ConnectionDrops("d1"); got != total {
					t.Errorf("%s: ConnectionDrops = %d, the backend dropped %d times", st.name, got, total)
				}
			}
		})
		t.Run(string(change)+"/none", func(t *testing.T) {
			ts := startSim(t, func(c *Config) { c.AllowHostChange = change })
			total := 0
			for _, st := range steps {
				ts.mustRun(st.cmd)
				if change == AllowHostChangeDrop {
					total += st.drop
				} else {
					total += st.keep
				}
				if got := ts.srv.ConnectionDrops("d1"); got != total {
					t.Errorf("%s: ConnectionDrops = %d, want %d", st.name, got, total)
				}
				disks := ts.srv.Disks()
				if st.exported && (len(disks) != 1 || !disks[0].NVMeTCPExport || disks[0].AllowHostName != st.host) {
					t.Errorf("%s: disks %+v", st.name, disks)
				}
			}
		})
	}
}

func TestParseAllowHostChange(t *testing.T) {
	for in, want := range map[string]AllowHostChange{"": AllowHostChangeKeep, "keep": AllowHostChangeKeep, "drop": AllowHostChangeDrop} {
		if got, err := ParseAllowHostChange(in); err != nil || got != want {
			t.Errorf("ParseAllowHostChange(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseAllowHostChange("Drop"); err == nil {
		t.Error("Drop accepted")
	}
	_, pub, err := NewTestKeys()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{DataDir: t.TempDir(), AuthorizedKeys: []ssh.PublicKey{pub}, AllowHostChange: "sometimes"}); err == nil || !strings.Contains(err.Error(), "keep or drop") {
		t.Errorf("New with a bad AllowHostChange: %v", err)
	}
}

// The fencing commands of pkg/rds: conditions joined by `and`, with or
// without `where`, on set, remove and print; a condition on a property
// /disk does not have is refused as RouterOS refuses it.
func TestFindWithConditions(t *testing.T) {
	ts := startSim(t, nil)
	ts.mustRun(addCmd("d1", "1G"))
	ts.mustRun(addCmd("d2", "1G"))
	ts.mustRun(setHost(simHostA))
	for _, tc := range []struct {
		cmd  string
		host string // d1's allowed host afterwards
	}{
		{`/disk set [find where slot="d1" and nvme-tcp-server-allow-host-name="` + simHostB + `" and nvme-tcp-export=yes] nvme-tcp-server-allow-host-name=""`, simHostA},
		{`/disk set [find where slot="d1" and nvme-tcp-server-allow-host-name="` + simHostA + `" and nvme-tcp-export=no] nvme-tcp-server-allow-host-name=""`, simHostA},
		{`/disk set [find where slot="d1" and nvme-tcp-server-allow-host-name="` + simHostA + `" and nvme-tcp-export=yes] nvme-tcp-server-allow-host-name="` + simHostB + `"`, simHostB},
		{`/disk set [find slot="d1" and nvme-tcp-server-allow-host-name="` + simHostB + `"] nvme-tcp-server-allow-host-name=""`, ""},
	} {
		ts.mustRun(tc.cmd)
		for _, d := range ts.srv.Disks() {
			want := ""
			if d.Slot == "d1" {
				want = tc.host
			}
			if d.AllowHostName != want {
				t.Errorf("after %s: %s allows %q, want %q", tc.cmd, d.Slot, d.AllowHostName, want)
			}
		}
	}
	out := ts.run(`/disk print detail where slot="d2" and nvme-tcp-server-allow-host-name="" and nvme-tcp-export=yes`)
	if !strings.Contains(out, `slot="d2"`) || strings.Contains(out, `slot="d1"`) {
		t.Errorf("print with conditions: %q", out)
	}
	for _, bad := range []string{
		`/disk set [find where slot="d1" and nvme-tcp-allowed-host="x"] nvme-tcp-export=no`,
		`/disk remove [find slot="d1" and no-such-property=1]`,
		`/disk print detail where slot="d1" and no-such-property=1`,
	} {
		if out := ts.run(bad); !strings.HasPrefix(out, "expected end of command") {
			t.Errorf("%s: %q, want expected end of command", bad, out)
		}
	}
	for _, bad := range []string{
		`/disk set [find where slot="d1" and] nvme-tcp-export=no`,
		`/disk set [find where slot="d1" and and nvme-tcp-export=no] nvme-tcp-export=no`,
	} {
		if out := ts.run(bad); out == "" {
			t.Errorf("%s was accepted", bad)
		}
	}
	ts.mustRun(`/disk remove [find where slot="d2" and nvme-tcp-export=yes and nvme-tcp-server-allow-host-name=""]`)
	if d := ts.srv.Disks(); len(d) != 1 || d[0].Slot != "d1" {
		t.Errorf("after the conditional remove: %+v", d)
	}
}
