package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/srvlab/rds-csi/pkg/nvme"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// selftestSim starts a simulator that prints like the hardware (80
// columns, CRLF, exit status 1 on a refusal), changed by mod, and a config
// for it.
func selftestSim(t *testing.T, mod func(*rdssim.Config)) (*rdssim.Server, rds.Config) {
	t.Helper()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id_ed25519")
	pub, err := rdssim.WriteClientKey(keyFile, "selftest")
	if err != nil {
		t.Fatal(err)
	}
	cfg := rdssim.Config{DataDir: filepath.Join(dir, "pool"), AuthorizedKeys: []ssh.PublicKey{pub}, CRLF: true, ExitStatusOnFailure: true}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := rdssim.New(cfg)
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
		nvmePort: 4420, timeout: time.Minute, loginOptions: "ct", copyWait: time.Minute}
}

func runSelftest(cfg rds.Config, o selftestOptions) (string, error) {
	var out bytes.Buffer
	err := selftest(context.Background(), context.Background(), cfg, o, &out)
	return out.String(), err
}

// simDataPath stands in for a host connected over NVMe/TCP: it reads and
// writes the simulator's backing file of the disk exported under an NQN,
// and, like an export that checks its allowed host, refuses a disk that is
// not exported to exactly that host (unless anyHost: an RDS that does
// not enforce its allowed host), and, like nvmet with the allowed host's
// DH-HMAC-CHAP key, a host without the disk's secret (unless noAuth: an
// RDS that takes the password and does not require it).
type simDataPath struct {
	srv     *rdssim.Server
	anyHost bool
	noAuth  bool
}

func (p simDataPath) slot(nqn, hostNQN string, secret nvme.DHCHAPSecret) (string, error) {
	for _, d := range p.srv.Disks() {
		if d.NVMeTCPNQN != nqn {
			continue
		}
		if !d.NVMeTCPExport || d.AllowHostName != hostNQN && !p.anyHost {
			return "", fmt.Errorf("%s refuses host %s: exported=%v, allowed host %q", nqn, hostNQN, d.NVMeTCPExport, d.AllowHostName)
		}
		// Like nvmet with the allowed host's DH-HMAC-CHAP key set.
		if d.Secret != "" && !p.noAuth && secret.Reveal() != d.Secret {
			return "", fmt.Errorf("%s refuses host %s: %w", nqn, hostNQN, nvme.ErrAuthFailed)
		}
		return d.Slot, nil
	}
	return "", fmt.Errorf("no subsystem %s", nqn)
}

func (p simDataPath) write(_ context.Context, nqn, hostNQN string, secret nvme.DHCHAPSecret, off int64, b []byte) error {
	slot, err := p.slot(nqn, hostNQN, secret)
	if err != nil {
		return err
	}
	return p.srv.WriteDisk(slot, off, b)
}

func (p simDataPath) read(_ context.Context, nqn, hostNQN string, secret nvme.DHCHAPSecret, off int64, n int) ([]byte, error) {
	slot, err := p.slot(nqn, hostNQN, secret)
	if err != nil {
		return nil, err
	}
	return p.srv.ReadDisk(slot, off, n)
}

func (simDataPath) describe() string { return "the simulator's backing files" }

// nothingLeft fails the test if the simulator holds a disk or a disk
// file.
func nothingLeft(t *testing.T, srv *rdssim.Server) {
	t.Helper()
	if d := srv.Disks(); len(d) != 0 {
		t.Errorf("disks left behind: %+v", d)
	}
	filepath.WalkDir(srv.DataDir(), func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".img") {
			t.Errorf("file left behind: %s", p)
		}
		return err
	})
}

// neverOpenToAnyHost fails the test if any scratch disk was ever exported
// with no allowed host.
func neverOpenToAnyHost(t *testing.T, srv *rdssim.Server) {
	t.Helper()
	for _, c := range srv.ExportLog() {
		if c.Export && c.AllowHost == "" {
			t.Errorf("disk %s was exported to any host (command %d)", c.Slot, c.Seq)
		}
	}
}

// factStatus is the status of fact id in a text report.
func factStatus(t *testing.T, report, id string) string {
	t.Helper()
	for _, l := range strings.Split(report, "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[1] == id && (f[0] == confirmed || f[0] == contradicted || f[0] == skipped) {
			return f[0]
		}
	}
	t.Errorf("no line for fact %s in:\n%s", id, report)
	return ""
}

// TestSelftestVariants runs the self-test against the simulator in both
// variants of each unknown copy-from behaviour, with and without a data
// path: every check passes where the RDS behaves as the driver needs, the
// data check fails where copy-from copies no data, each fact is reported
// as measured, no scratch disk is ever open to any host, and nothing is
// left behind.
func TestSelftestVariants(t *testing.T) {
	for _, tc := range []struct {
		props          rdssim.CopyFromProperties
		data           rdssim.CopyFromData
		withData       bool
		wantInherits   string
		wantCopyData   string
		wantFailedData bool
	}{
		{rdssim.CopyFromInherit, rdssim.CopyFromDataCopy, true, confirmed, confirmed, false},
		{rdssim.CopyFromFresh, rdssim.CopyFromDataCopy, true, contradicted, confirmed, false},
		{rdssim.CopyFromInherit, rdssim.CopyFromDataNone, true, confirmed, contradicted, true},
		{rdssim.CopyFromFresh, rdssim.CopyFromDataNone, true, contradicted, contradicted, true},
		{rdssim.CopyFromInherit, rdssim.CopyFromDataNone, false, confirmed, skipped, false},
	} {
		t.Run(fmt.Sprintf("%s/%s/data=%v", tc.props, tc.data, tc.withData), func(t *testing.T) {
			srv, cfg := selftestSim(t, func(c *rdssim.Config) { c.CopyFromProperties, c.CopyFromData = tc.props, tc.data })
			o := selftestOpts()
			if tc.withData {
				o.data = simDataPath{srv: srv}
			}
			report, err := runSelftest(cfg, o)
			if tc.wantFailedData {
				if err == nil || !strings.Contains(report, "FAIL  data: the restore holds the volume's data") || !strings.Contains(report, "--copy-from-data=unsupported") {
					t.Errorf("a copy without data: err %v, report:\n%s", err, report)
				}
			} else if err != nil {
				t.Fatalf("%v\n%s", err, report)
			}
			if got := factStatus(t, report, "copy-inherits"); got != tc.wantInherits {
				t.Errorf("copy-inherits %s, want %s", got, tc.wantInherits)
			}
			if got := factStatus(t, report, "copy-data"); got != tc.wantCopyData {
				t.Errorf("copy-data %s, want %s", got, tc.wantCopyData)
			}
			if !tc.withData && !strings.Contains(report, "the data check was skipped") {
				t.Errorf("without a data path the report does not say the data check was skipped:\n%s", report)
			}
			for _, id := range []string{"cas-stale", "find-where-and", "set-two-props", "closed-print", "add-closed", "allow-host-uuid", "size-suffix", "size-print", "wrap-rejoin", "file-regex", "flag-columns", "file-remove-in-use", "legend-empty", "silent-success", "copy-complete", "legend-used", "print-where", "clock-file-time"} {
				if got := factStatus(t, report, id); got != confirmed {
					t.Errorf("fact %s: %s, want confirmed (the simulator behaves as documented)", id, got)
				}
			}
			for _, def := range selftestFacts {
				if n := strings.Count(report, " "+def.id+" "); n != 1 {
					t.Errorf("fact %s has %d lines, want 1", def.id, n)
				}
			}
			// After a failed data check the password's checks are skipped.
			wantSecret, wantEnforced := confirmed, skipped
			if tc.wantFailedData {
				wantSecret = skipped
			} else if tc.withData {
				wantEnforced = confirmed
			}
			if got := factStatus(t, report, "password-secret"); got != wantSecret {
				t.Errorf("password-secret %s, want %s (the simulator prints the secret)", got, wantSecret)
			}
			if got := factStatus(t, report, "password-enforced"); got != wantEnforced {
				t.Errorf("password-enforced %s, want %s", got, wantEnforced)
			}
			neverOpenToAnyHost(t, srv)
			nothingLeft(t, srv)
		})
	}
}

// The export password's lines (issue 26) say what the box showed: an RDS
// that takes the password but lets the allowed host in without the secret
// fails the data check and contradicts password-enforced; one that
// refuses the property contradicts password-secret and the rest of the
// self-test passes. Either way the disk is closed again and nothing is
// left.
func TestSelftestExportPassword(t *testing.T) {
	t.Run("not enforced", func(t *testing.T) {
		srv, cfg := selftestSim(t, nil)
		o := selftestOpts()
		o.data = simDataPath{srv: srv, noAuth: true}
		report, err := runSelftest(cfg, o)
		if err == nil || !strings.Contains(report, "FAIL  data: the allowed host without the secret") || !strings.Contains(report, "not enforced") {
			t.Errorf("err %v, report:\n%s", err, report)
		}
		if got := factStatus(t, report, "password-secret"); got != confirmed {
			t.Errorf("password-secret %s", got)
		}
		if got := factStatus(t, report, "password-enforced"); got != contradicted {
			t.Errorf("password-enforced %s", got)
		}
		nothingLeft(t, srv)
	})
	t.Run("refused", func(t *testing.T) {
		srv, cfg := selftestSim(t, nil)
		// The copies before it name no password (their sources have
		// none, so they send no nvme-tcp-server-password=""): the first
		// command that names the property is the self-test's set.
		srv.InjectFault(rdssim.Fault{Kind: rdssim.FaultFail, Match: "nvme-tcp-server-password=", Nth: 1, Output: "expected end of command (line 1 column 90)"})
		o := selftestOpts()
		o.data = simDataPath{srv: srv}
		report, err := runSelftest(cfg, o)
		if err != nil || !strings.Contains(report, "the box takes no export password") {
			t.Fatalf("err %v, report:\n%s", err, report)
		}
		if got := factStatus(t, report, "password-secret"); got != contradicted {
			t.Errorf("password-secret %s", got)
		}
		if got := factStatus(t, report, "password-enforced"); got != skipped {
			t.Errorf("password-enforced %s", got)
		}
		nothingLeft(t, srv)
	})
}

// TestSelftestReportsFailureAndCleansUp: a refused resize fails the run,
// the later checks are skipped, and the scratch disk is removed anyway.
func TestSelftestReportsFailureAndCleansUp(t *testing.T) {
	srv, cfg := selftestSim(t, nil)
	srv.FailNth(1, "] file-size=", "invalid parameter")
	report, err := runSelftest(cfg, selftestOpts())
	if err == nil || !strings.Contains(report, "FAIL  resize") || !strings.Contains(report, "invalid parameter") ||
		!strings.Contains(report, "SKIP  snapshot (copy") {
		t.Fatalf("err %v, report:\n%s", err, report)
	}
	if got := factStatus(t, report, "copy-data"); got != skipped {
		t.Errorf("copy-data after a failure: %s", got)
	}
	nothingLeft(t, srv)
}

// TestSelftestPatientWithLongCopies: a copy that outlives the client's
// copy timeout is still running on the RDS when the checks end; its file
// cannot be removed until it completes. The cleanup waits for it and
// removes it (before, the cleanup failed and left the copy behind).
func TestSelftestPatientWithLongCopies(t *testing.T) {
	srv, cfg := selftestSim(t, func(c *rdssim.Config) { c.CopyRate = 64 * rds.MiB }) // 128 MiB: 2 s
	cfg.CopyTimeout = 100 * time.Millisecond
	report, err := runSelftest(cfg, selftestOpts())
	if err == nil || !strings.Contains(report, "FAIL  snapshot (copy") || !strings.Contains(report, "cleanup: removed "+scratchOf(report)+"-snap") {
		t.Errorf("err %v, report:\n%s", err, report)
	}
	if strings.Contains(report, "LEFT") {
		t.Errorf("the cleanup left something:\n%s", report)
	}
	nothingLeft(t, srv)
}

func scratchOf(report string) string {
	i := strings.Index(report, scratchPrefix)
	if i < 0 {
		return "?"
	}
	return strings.TrimRight(strings.Fields(report[i:])[0], "*,")
}

// TestSelftestSignal: SIGINT, SIGTERM, SIGHUP (the terminal closed) or
// SIGQUIT while a copy runs on the RDS
// stops the checks; the cleanup waits for the copy and removes every
// scratch disk and file; the run reports the interruption.
func TestSelftestSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT} {
		t.Run(sig.String(), func(t *testing.T) {
			srv, cfg := selftestSim(t, func(c *rdssim.Config) { c.CopyRate = 64 * rds.MiB }) // 128 MiB: 2 s
			var out bytes.Buffer
			done := make(chan error, 1)
			go func() { done <- selftestWithSignals(cfg, selftestOpts(), &out) }()
			waitForCommand(t, srv, "copy-from")
			if err := syscall.Kill(os.Getpid(), sig); err != nil {
				t.Fatal(err)
			}
			err := <-done
			report := out.String()
			if err == nil || !strings.Contains(err.Error(), "interrupted by "+sig.String()) || !strings.Contains(report, "SKIP  delete") {
				t.Errorf("err %v, report:\n%s", err, report)
			}
			neverOpenToAnyHost(t, srv)
			nothingLeft(t, srv)
		})
	}
}

// waitForCommand waits until the simulator has received a command
// containing match (logged before it runs).
func waitForCommand(t *testing.T, srv *rdssim.Server, match string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, c := range srv.Commands() {
			if strings.Contains(c.Text, match) {
				return
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the simulator never received %q", match)
}

// TestSelftestJSON: -o json prints one document with every check, a fact
// for each of selftestFacts and the cleanup, and nothing else.
func TestSelftestJSON(t *testing.T) {
	srv, cfg := selftestSim(t, nil)
	o := selftestOpts()
	o.json = true
	text, err := runSelftest(cfg, o)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	var rep report
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil || dec.More() {
		t.Fatalf("not one JSON document: %v\n%s", err, text)
	}
	if rep.Failed != 0 || len(rep.Checks) < 20 || len(rep.Facts) != len(selftestFacts) || len(rep.Cleanup) == 0 || rep.Commands == 0 {
		t.Errorf("report: %+v", rep)
	}
	for i, f := range rep.Facts {
		if f.ID != selftestFacts[i].id || f.Measured == "" || (f.Status != confirmed && f.Status != contradicted && f.Status != skipped) {
			t.Errorf("fact %d: %+v", i, f)
		}
	}
	for _, c := range rep.Checks {
		if c.Status != "ok" {
			t.Errorf("check %+v", c)
		}
	}
	nothingLeft(t, srv)
}

func TestSelftestCommand(t *testing.T) {
	flags, _, srv := simWithKey(t)
	var stdout, stderr bytes.Buffer
	if err := run(append(flags, "--login-options", "ct", "selftest", "-o", "json"), &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	var rep report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Failed != 0 {
		t.Errorf("%v: %s", err, stdout.String())
	}
	if err := run(append(flags, "selftest", "-o", "yaml"), &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "-o") {
		t.Errorf("-o yaml: %v", err)
	}
	nothingLeft(t, srv)
}

// lockedWriter is an io.Writer safe to read while the self-test writes.
type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestSelftestSecondSignal: a second SIGINT while the cleanup waits for a
// running copy abandons the cleanup; the report names what is left and
// how to remove it, and the run fails.
func TestSelftestSecondSignal(t *testing.T) {
	srv, cfg := selftestSim(t, func(c *rdssim.Config) { c.CopyRate = 16 * rds.MiB }) // 128 MiB: 8 s
	var out lockedWriter
	done := make(chan error, 1)
	go func() { done <- selftestWithSignals(cfg, selftestOpts(), &out) }()
	waitForCommand(t, srv, "copy-from")
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "a copy may still be running") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := <-done
	report := out.String()
	if err == nil || !strings.Contains(err.Error(), "left on the RDS") || !strings.Contains(report, "cleanup abandoned after a second interrupt") ||
		!strings.Contains(report, "remove it by hand: /disk remove [find slot=") {
		t.Errorf("err %v, report:\n%s", err, report)
	}
}

// TestSelftestJSONRefusesShowCommands: the transcript -show-commands
// prints on stdout would break the JSON document.
func TestSelftestJSONRefusesShowCommands(t *testing.T) {
	flags, _, srv := simWithKey(t)
	var stdout, stderr bytes.Buffer
	err := run(append(flags, "selftest", "-o", "json", "-show-commands"), &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "-show-commands") || len(srv.Commands()) != 0 {
		t.Errorf("err %v, %d commands sent", err, len(srv.Commands()))
	}
}

// TestSelftestAllowedHostNotEnforced: an RDS that lets another host than
// the allowed one connect fails the data check and contradicts the fact.
func TestSelftestAllowedHostNotEnforced(t *testing.T) {
	srv, cfg := selftestSim(t, nil)
	o := selftestOpts()
	o.data = simDataPath{srv: srv, anyHost: true}
	report, err := runSelftest(cfg, o)
	if err == nil || !strings.Contains(report, "FAIL  data: another host is refused") {
		t.Errorf("err %v, report:\n%s", err, report)
	}
	if got := factStatus(t, report, "allow-host-enforced"); got != contradicted {
		t.Errorf("allow-host-enforced %s", got)
	}
	nothingLeft(t, srv)
}

// TestSelftestPanicInACheck: a check that panics fails the run; the
// scratch disks are removed anyway.
func TestSelftestPanicInACheck(t *testing.T) {
	srv, cfg := selftestSim(t, nil)
	o := selftestOpts()
	o.data = panickingDataPath{}
	report, err := runSelftest(cfg, o)
	if err == nil || !strings.Contains(report, "FAIL  data: write a pattern to the volume") || !strings.Contains(report, "panic: the data path broke") {
		t.Errorf("err %v, report:\n%s", err, report)
	}
	nothingLeft(t, srv)
}

type panickingDataPath struct{}

func (panickingDataPath) write(context.Context, string, string, nvme.DHCHAPSecret, int64, []byte) error {
	panic("the data path broke")
}

func (panickingDataPath) read(context.Context, string, string, nvme.DHCHAPSecret, int64, int) ([]byte, error) {
	panic("the data path broke")
}

func (panickingDataPath) describe() string { return "a data path that panics" }

// TestSelftestPipedIntoHead: `rdsctl selftest -show-commands | head -60`.
// Once head has its lines and exits, rdsctl's next write to the pipe
// fails (EPIPE; unhandled, SIGPIPE would end rdsctl with status 141 and
// its scratch disks left on the RDS): the checks stop, the cleanup
// removes every scratch disk and file, and rdsctl exits 1 saying its
// output was closed. The first copy is held (CopyGate) until head has
// exited, so rdsctl still has lines to write when it finds the pipe
// closed, whatever the pipe's buffer holds.
func TestSelftestPipedIntoHead(t *testing.T) {
	gate := make(chan struct{})
	flags, _, srv := simWithKey(t, func(c *rdssim.Config) { c.CopyGate = gate })
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	rdsctl := exec.Command(os.Args[0], append(flags, "selftest", "-show-commands")...)
	rdsctl.Env = append(os.Environ(), "RDSCTL_TEST_RUN_MAIN=1")
	var stderr strings.Builder
	rdsctl.Stdout, rdsctl.Stderr = pw, &stderr
	head := exec.Command("head", "-60")
	var headOut strings.Builder
	head.Stdin, head.Stdout = pr, &headOut
	if err := rdsctl.Start(); err != nil {
		t.Fatal(err)
	}
	if err := head.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close() // the children hold the pipe's ends now
	pr.Close()
	if err := head.Wait(); err != nil {
		t.Fatalf("head: %v", err)
	}
	close(gate)
	err = rdsctl.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr.String(), "its output was closed") {
		t.Errorf("rdsctl selftest | head -60: %v (status %v), stderr %q; want exit status 1 saying its output was closed", err, exit, stderr.String())
	}
	if n := strings.Count(headOut.String(), "\n"); n != 60 {
		t.Errorf("head printed %d lines, want 60", n)
	}
	neverOpenToAnyHost(t, srv)
	nothingLeft(t, srv)
}
