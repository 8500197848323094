//go:build review25

package docs

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeScript is README.md's run blocks, as TestDocumentedCommands joins
// them, with the documented port replaced by port.
func readmeScript(t *testing.T, root, port string) string {
	t.Helper()
	blocks, err := shellBlocks(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, b := range blocks {
		if b.marker == "run" {
			parts = append(parts, b.text)
		}
	}
	if len(parts) == 0 {
		t.Fatal("README.md has no run block")
	}
	return portPattern.ReplaceAllString(strings.Join(parts, "\n"), "${1}"+port)
}

// runIn runs script with bash -euo pipefail in dir, killing its process
// group after limit (a hang is the failure some tests look for).
func runIn(t *testing.T, dir, script string, limit time.Duration) (out string, err error, hung bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(dir, "home"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	kill := func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Cancel = kill
	var b strings.Builder
	cmd.Stdout, cmd.Stderr = &b, &b
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if kerr := kill(); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
		t.Logf("kill: %v", kerr)
	}
	return b.String(), err, ctx.Err() != nil
}

func scratch(t *testing.T, root string) string {
	t.Helper()
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("needs the ssh client")
	}
	work := t.TempDir()
	bin := filepath.Join(work, "bin")
	buildBinaries(t, root, bin)
	if err := os.Mkdir(filepath.Join(work, "home"), 0o700); err != nil {
		t.Fatal(err)
	}
	return work
}

// HOLE: the README's simulator example passes only because the docs test
// runs it once in a fresh directory. Run a second time from the same
// checkout (as a user who tries it again does), `bin/rdsctl gen-key
// sim_key` fails with "file exists" (gen-key never overwrites), and under
// bash -e (or in a script) the example stops there. The README does not
// say to remove sim_key* first.
func TestReview25ReadmeRunsTwiceInOneCheckout(t *testing.T) {
	root := repoRoot(t)
	work := scratch(t, root)
	for i := 1; i <= 2; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		l.Close()
		out, err, hung := runIn(t, work, readmeScript(t, root, port), 2*time.Minute)
		if err != nil || hung {
			t.Fatalf("run %d of the README's simulator example in one checkout: %v (hung %v)\n%s", i, err, hung, out)
		}
	}
}

// HOLE: when the simulator cannot start (the documented port 2222 in use,
// e.g. by a simulator of an earlier try still running, or any service),
// the README's `until grep -qs 'listening on' rds-sim.log; do sleep 0.2;
// done` waits forever: a new user's shell hangs with no message (the
// reason is only in rds-sim.log). The docs test never sees it: it
// replaces 2222 by a port it has just found free. Here the port is held
// by a listener; the example should fail, not spin (bounded at 60s).
func TestReview25ReadmeBusyPortFails(t *testing.T) {
	root := repoRoot(t)
	work := scratch(t, root)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	out, err, hung := runIn(t, work, readmeScript(t, root, port), 60*time.Second)
	if hung {
		t.Fatalf("with port %s in use the README's simulator example hangs (still waiting for 'listening on' after 60s); output:\n%s", port, out)
	}
	if err == nil {
		t.Errorf("with port %s in use the README's simulator example succeeded?\n%s", port, out)
	}
}
