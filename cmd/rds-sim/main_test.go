package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// clientKey writes an authorized_keys file for a fresh client key.
func clientKey(t *testing.T) (ssh.Signer, string) {
	t.Helper()
	signer, pub, err := rdssim.NewTestKeys()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "authorized_keys")
	if err := os.WriteFile(path, ssh.MarshalAuthorizedKey(pub), 0o600); err != nil {
		t.Fatal(err)
	}
	return signer, path
}

// readBanner reads the start-up lines and returns the listen address and
// the host key fingerprint.
func readBanner(t *testing.T, r *bufio.Reader) (addr, fingerprint string) {
	t.Helper()
	for addr == "" || fingerprint == "" {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading start-up output: %v (so far %q)", err, line)
		}
		if a, ok := strings.CutPrefix(line, "rds-sim listening on "); ok {
			addr = strings.TrimSpace(a)
		}
		if f, ok := strings.CutPrefix(line, "host key ssh-ed25519 "); ok {
			fingerprint = strings.TrimSpace(f)
		}
	}
	return addr, fingerprint
}

func dialAndRun(t *testing.T, addr string, signer ssh.Signer, hostKeys ssh.HostKeyCallback, cmds ...string) []string {
	t.Helper()
	c, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{
		User:            "admin",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: hostKeys,
		Timeout:         30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var outs []string
	for _, cmd := range cmds {
		sess, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		out, err := sess.CombinedOutput(cmd)
		sess.Close()
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		outs = append(outs, string(out))
	}
	return outs
}

func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	p := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(p); err != nil {
		t.Skip("no go tool to build the binary")
	}
	return p
}

func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "rds-sim")
	build := exec.Command(goTool(t), "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	signer, authKeys := clientKey(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	knownHosts := filepath.Join(t.TempDir(), "known_hosts")
	start := func() (*exec.Cmd, *bufio.Reader, *bytes.Buffer) {
		cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--pool-size", "20G",
			"--authorized-keys", authKeys, "--write-known-hosts", knownHosts, "--latency", "1ms")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
		})
		return cmd, bufio.NewReader(stdout), &stderr
	}
	stop := func(cmd *exec.Cmd, out *bufio.Reader, stderr *bytes.Buffer) {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		rest, _ := io.ReadAll(out)
		if err := cmd.Wait(); err != nil {
			t.Errorf("exit after SIGTERM: %v\nstdout: %s\nstderr: %s", err, rest, stderr)
		}
		if !strings.Contains(string(rest), "shutting down") {
			t.Errorf("no shutdown message: %q", rest)
		}
	}

	cmd, out, stderr := start()
	addr, fp := readBanner(t, out)
	hostKeys, err := knownhosts.New(knownHosts)
	if err != nil {
		t.Fatal(err)
	}
	outs := dialAndRun(t, addr, signer, hostKeys,
		"/system resource print",
		`/disk add type=file file-path="/storage-pool/k8s/pvc-1.img" file-size=1G slot="pvc-1" nvme-tcp-export=yes nvme-tcp-server-port=4420 nvme-tcp-server-nqn="nqn.2000-02.com.mikrotik:pvc-1"`,
		`/disk print detail where mount-point="storage-pool"`,
	)
	if !strings.Contains(outs[0], "board-name: RDS2216") || outs[1] != "" || !strings.Contains(outs[2], "size=21 474 836 480 free=20 401 094 656 ") {
		t.Errorf("outputs: %q", outs)
	}
	if fi, err := os.Stat(filepath.Join(dataDir, "k8s", "pvc-1.img")); err != nil || fi.Size() != 1<<30 {
		t.Errorf("backing file: %v %v", fi, err)
	}
	stop(cmd, out, stderr)

	// Restarted on the same data dir: same host key, same disks.
	cmd, out, stderr = start()
	addr2, fp2 := readBanner(t, out)
	if fp2 != fp {
		t.Errorf("host key changed across restart: %s, then %s", fp, fp2)
	}
	hostKeys, err = knownhosts.New(knownHosts)
	if err != nil {
		t.Fatal(err)
	}
	outs = dialAndRun(t, addr2, signer, hostKeys, `/disk print detail where slot="pvc-1"`)
	if !strings.Contains(outs[0], `slot="pvc-1"`) {
		t.Errorf("disk lost across restart: %q", outs[0])
	}
	stop(cmd, out, stderr)
}

func TestRunFlags(t *testing.T) {
	_, authKeys := clientKey(t)
	dir := t.TempDir()
	// A flag error writes nothing: not even the data directory (nor the
	// host key in it) is created.
	fresh := filepath.Join(t.TempDir(), "fresh")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no data dir", []string{"--authorized-keys", authKeys}, "--data-dir is required"},
		{"no keys", []string{"--data-dir", dir}, "--authorized-keys is required"},
		{"bad pool size", []string{"--data-dir", dir, "--authorized-keys", authKeys, "--pool-size", "lots"}, "--pool-size"},
		{"missing keys file", []string{"--data-dir", dir, "--authorized-keys", filepath.Join(dir, "none")}, "authorized keys"},
		{"extra argument", []string{"--data-dir", dir, "--authorized-keys", authKeys, "now"}, "unexpected arguments"},
		{"unknown flag", []string{"--colour"}, "flag provided but not defined"},
		{"nvmet asked for without configfs", []string{"--data-dir", dir, "--authorized-keys", authKeys, "--nvme-export=nvmet", "--nvmet-root", filepath.Join(dir, "no-configfs")}, "modprobe nvmet"},
		{"bad export backend", []string{"--data-dir", dir, "--authorized-keys", authKeys, "--nvme-export=iscsi"}, "--nvme-export"},
		{"bad allow-host change", []string{"--data-dir", dir, "--authorized-keys", authKeys, "--allow-host-change=sometimes"}, "--allow-host-change"},
		{"bad copy-from properties", []string{"--data-dir", dir, "--authorized-keys", authKeys, "--copy-from-properties=some"}, "--copy-from-properties"},
		{"bad copy-from data", []string{"--data-dir", dir, "--authorized-keys", authKeys, "--copy-from-data=zeros"}, "--copy-from-data"},
		{"bad closed-export props", []string{"--data-dir", dir, "--authorized-keys", authKeys, "--closed-export-props=sometimes"}, "--closed-export-props"},
		{"bad global requests", []string{"--data-dir", dir, "--authorized-keys", authKeys, "--global-requests=maybe"}, "--global-requests"},
		{"bad value break", []string{"--data-dir", dir, "--authorized-keys", authKeys, "--value-break=anywhere"}, "--value-break"},
		{"bad legend", []string{"--data-dir", dir, "--authorized-keys", authKeys, "--legend=some"}, "--legend"},
		{"fault control on a regular file", []string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--authorized-keys", authKeys, "--nvme-export=none", "--fault-control", authKeys}, "exists and is not a socket"},
		{"no terminal width", []string{"--data-dir", fresh, "--authorized-keys", authKeys, "--terminal-width", "0"}, "--terminal-width 0: want -1 (no wrapping) or at least 40 columns"},
		{"a negative terminal width", []string{"--data-dir", fresh, "--authorized-keys", authKeys, "--terminal-width", "-5"}, "--terminal-width -5"},
		{"a terminal too narrow", []string{"--data-dir", fresh, "--authorized-keys", authKeys, "--terminal-width", "10"}, "--terminal-width 10"},
		{"a negative latency", []string{"--data-dir", fresh, "--authorized-keys", authKeys, "--latency", "-1s"}, "--latency -1s: want 0 to 1h0m0s"},
		{"a latency past every timeout", []string{"--data-dir", fresh, "--authorized-keys", authKeys, "--latency", "2h"}, "--latency 2h0m0s"},
		{"a listen address without a port", []string{"--data-dir", fresh, "--authorized-keys", authKeys, "--listen", "127.0.0.1"}, "--listen \"127.0.0.1\": want host:port"},
		{"a listen port out of range", []string{"--data-dir", fresh, "--authorized-keys", authKeys, "--listen", "127.0.0.1:70000"}, "--listen \"127.0.0.1:70000\""},
		{"an nvmet address that is no IP address", []string{"--data-dir", fresh, "--authorized-keys", authKeys, "--nvmet-address", "localhost"}, "--nvmet-address \"localhost\": want an IP address"},
		{"nvmet settings without nvmet", []string{"--data-dir", fresh, "--authorized-keys", authKeys, "--nvme-export=none", "--nvmet-address", "127.0.0.2"}, "--nvmet-address needs --nvme-export=nvmet or auto"},
		{"a fault control path too long for a socket", []string{"--data-dir", fresh, "--authorized-keys", authKeys, "--fault-control", "/tmp/" + strings.Repeat("f", 110)}, "too long for a unix socket: at most 107 bytes"},
		{"fault control in a missing directory", []string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--authorized-keys", authKeys, "--nvme-export=none", "--fault-control", filepath.Join(dir, "none", "f.sock")}, "--fault-control"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Cancelled: flags taken would start the simulator and
			// return at once, not serve.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err := run(ctx, tc.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
			}
			if _, err := os.Stat(fresh); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("run(%q) created %s: %v", tc.args, fresh, err)
				os.RemoveAll(fresh)
			}
		})
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	signer, authKeys := clientKey(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--authorized-keys", authKeys, "--pool-name", "pool2", "-v", "2",
			"--nvme-export=none", "--allow-host-change=drop"}, pw, io.Discard)
		pw.Close()
	}()
	r := bufio.NewReader(pr)
	addr, _ := readBanner(t, r)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("no allowed-host line in the banner: %v", err)
		}
		if strings.HasPrefix(line, "a change of a disk's allowed host: ") {
			if !strings.Contains(line, "drop established connections") {
				t.Errorf("banner: %q", line)
			}
			break
		}
	}
	key, err := rdssim.LoadOrGenerateHostKey(filepath.Join(dir, ".rdssim-host-key"))
	if err != nil {
		t.Fatal(err)
	}
	outs := dialAndRun(t, addr, signer, ssh.FixedHostKey(key.PublicKey()), `/disk print detail where mount-point="pool2"`)
	if !strings.Contains(outs[0], `mount-point="pool2"`) {
		t.Errorf("pool: %q", outs[0])
	}
	go io.Copy(io.Discard, r)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}

// --fault-control: a test in another process holds a command to land
// late and releases it; the socket is private and gone after the exit.
func TestRunFaultControl(t *testing.T) {
	signer, authKeys := clientKey(t)
	dir := t.TempDir()
	sock := filepath.Join(t.TempDir(), "faults.sock")
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--authorized-keys", authKeys,
			"--nvme-export=none", "--fault-control", sock}, pw, io.Discard)
		pw.Close()
	}()
	r := bufio.NewReader(pr)
	addr, _ := readBanner(t, r)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("no fault control line in the banner: %v", err)
		}
		if strings.HasPrefix(line, "fault control on "+sock) {
			break
		}
	}
	go io.Copy(io.Discard, r)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("fault control socket: %v, %v; want mode 0600", fi, err)
	}
	ctl, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	answers := bufio.NewReader(ctl)
	ask := func(req string) string {
		t.Helper()
		if _, err := ctl.Write([]byte(req + "\n")); err != nil {
			t.Fatal(err)
		}
		a, err := answers.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", req, err)
		}
		return strings.TrimSpace(a)
	}
	if a := ask(`late match="/disk add" delay=1h`); !strings.HasPrefix(a, "ok armed late") {
		t.Fatalf("arm: %q", a)
	}
	if a := ask(`late delay=1 count=1`); !strings.HasPrefix(a, "error: delay=1") {
		t.Errorf("a delay without unit: %q", a)
	}
	key, err := rdssim.LoadOrGenerateHostKey(filepath.Join(dir, ".rdssim-host-key"))
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan []string, 1)
	go func() {
		held <- dialAndRun(t, addr, signer, ssh.FixedHostKey(key.PublicKey()),
			`/disk add type=file file-path="/storage-pool/k8s/a.img" file-size=1G slot="a"`)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for ask("status") != "ok armed=0 held=1" {
		if time.Now().After(deadline) {
			t.Fatal("the command was never held")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if a := ask("release"); a != "ok released=1" {
		t.Errorf("release: %q", a)
	}
	if outs := <-held; outs[0] != "" {
		t.Errorf("the late command's reply: %q", outs[0])
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
	if _, err := os.Lstat(sock); err == nil {
		t.Error("the fault control socket outlived the simulator")
	}
}

func TestUsageDocumentsFaultControl(t *testing.T) {
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"-help"}, io.Discard, &stderr); err == nil {
		t.Fatal("-help: no error")
	}
	for _, want := range []string{"-fault-control", "late match=", "release", "status", "count=all"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("usage does not mention %q:\n%s", want, stderr.String())
		}
	}
}
