package main

import (
	"bytes"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// selftestSim starts a simulator that prints like the hardware (80
// columns, CRLF, exit status 1 on a refusal) and a config for it.
func selftestSim(t *testing.T) (*rdssim.Server, rds.Config) {
	t.Helper()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	pub, err := rdssim.WriteClientKey(keyFile, "selftest")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rdssim.New(rdssim.Config{DataDir: filepath.Join(dir, "pool"), AuthorizedKeys: []ssh.PublicKey{pub},
		CRLF: true, ExitStatusOnFailure: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	addr, err := srv.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	known := filepath.Join(dir, "known_hosts")
	if err := srv.WriteKnownHosts(known); err != nil {
		t.Fatal(err)
	}
	host, portStr, _ := strings.Cut(addr, ":")
	port, _ := strconv.Atoi(portStr)
	return srv, rds.Config{Address: host, Port: port, User: "admin", KeyFile: keyFile, KnownHostsFile: known, LoginOptions: "ct"}
}

func selftestOpts() selftestOptions {
	return selftestOptions{pool: "storage-pool", basePath: rds.DefaultVolumePath, nqnPrefix: "nqn.2000-02.com.mikrotik:",
		nvmePort: 4420, timeout: time.Minute, loginOptions: "ct"}
}

// TestSelftestAgainstSimulator: every check passes over SSH against the
// simulator wrapping at 80 columns, and nothing is left behind.
func TestSelftestAgainstSimulator(t *testing.T) {
	srv, cfg := selftestSim(t)
	var out bytes.Buffer
	if err := selftest(cfg, selftestOpts(), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	report := out.String()
	for _, want := range []string{"ok    probe", "ok    create", "ok    resize", "ok    snapshot (copy)", "ok    restore (copy, grown)",
		"ok    find file by prefix", "ok    delete snapshot", "ok    delete volume", "ok    fencing: open to one host", "ok    fencing: move to another host",
		"ok    fencing: close for another host", "ok    fencing: close ", "ok    fencing: open to any host", "19 checks, 0 failed", "longest print line: 80 columns"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if d := srv.Disks(); len(d) != 0 {
		t.Errorf("left behind: %+v", d)
	}
}

// TestSelftestReportsFailureAndCleansUp: a refused resize fails the run,
// the later checks are skipped, and the scratch disk is removed anyway.
func TestSelftestReportsFailureAndCleansUp(t *testing.T) {
	srv, cfg := selftestSim(t)
	srv.FailNth(1, "] file-size=", "invalid parameter")
	var out bytes.Buffer
	err := selftest(cfg, selftestOpts(), &out)
	report := out.String()
	if err == nil || !strings.Contains(report, "FAIL  resize") || !strings.Contains(report, "invalid parameter") ||
		!strings.Contains(report, "SKIP  snapshot (copy)") {
		t.Fatalf("err %v, report:\n%s", err, report)
	}
	if d := srv.Disks(); len(d) != 0 {
		t.Errorf("left behind: %+v", d)
	}
}

func TestSelftestCommand(t *testing.T) {
	flags, _, srv := simWithKey(t)
	if err := run(append(flags, "--login-options", "ct", "selftest"), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if d := srv.Disks(); len(d) != 0 {
		t.Errorf("left behind: %+v", d)
	}
}
