package docs

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testRecipe is the recipe of the Makefile's test target, which starts
// the NVMe/TCP VM tier (make e2e-nvme) in a session of its own beside the
// rest (make test-host-rest).
func testRecipe(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^test:[^\n]*\n((?:\t[^\n]*\n)+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("the Makefile has no test target with a recipe")
	}
	return string(m[1])
}

// A make test stopped by its terminal (a hang-up, Ctrl-C, Ctrl-\, a
// TERM to its process group) stops the VM tier too: in a session of its
// own, the VM tier gets none of those signals itself, and left running it
// holds a core and .cache/nvme-vm for its ~9 minutes, beside the next
// make test's. The test's recipe runs as written, with stand-ins for the
// tiers.
func TestAStoppedMakeTestStopsTheVMTier(t *testing.T) {
	for _, tool := range []string{"make", "setsid", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s in PATH", tool)
		}
	}
	recipe := testRecipe(t)
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			started := filepath.Join(dir, "started")
			if err := syscall.Mkfifo(started, 0o600); err != nil {
				t.Fatal(err)
			}
			// Each stand-in says its pid, then becomes a sleep that runs
			// until stopped.
			makefile := "SHELL := /bin/bash\nCACHE := .cache\n" +
				"test:\n" + recipe +
				"test-host-rest:\n\t@echo rest $$$$ >started; exec sleep 600\n" +
				"e2e-nvme:\n\t@echo vm $$$$ >started; exec sleep 600\n" +
				".PHONY: test test-host-rest e2e-nvme\n"
			if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte(makefile), 0o644); err != nil {
				t.Fatal(err)
			}
			// Read and written: the reader never sees the end of the FIFO.
			fifo, err := os.OpenFile(started, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer fifo.Close()

			cmd := exec.Command("make", "--no-print-directory", "test")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })

			lines := make(chan string)
			go func() {
				r := bufio.NewScanner(fifo)
				for r.Scan() {
					lines <- r.Text()
				}
			}()
			pids := map[string]int{}
			timeout := time.After(time.Minute) // a safety net; both start at once
			for len(pids) < 2 {
				select {
				case l := <-lines:
					tier, pid, _ := strings.Cut(l, " ")
					n, err := strconv.Atoi(pid)
					if err != nil {
						t.Fatalf("a stand-in said %q", l)
					}
					pids[tier] = n
					t.Cleanup(func() { _ = syscall.Kill(n, syscall.SIGKILL) })
				case <-timeout:
					t.Fatal("the stand-ins of the tiers did not start")
				}
			}
			vm := pids["vm"]
			if vm == 0 || pids["rest"] == 0 {
				t.Fatalf("the stand-ins said %v; want a vm and a rest", pids)
			}
			// Once each is its sleep: a signal that came to the stand-in's
			// shell before its exec would be lost with the shell (bash
			// defers SIGINT), which a real tier, long running, never meets.
			for _, pid := range pids {
				for deadline := time.Now().Add(time.Minute); comm(pid) != "sleep"; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) { // a safety net
						t.Fatalf("stand-in %d is %q, not its sleep", pid, comm(pid))
					}
				}
			}

			// What a terminal does: the signal to make's process group.
			if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if err == nil {
					t.Error("make test succeeded after it was stopped")
				}
			case <-time.After(time.Minute): // a safety net
				t.Fatal("make test did not end after the signal")
			}
			if running(vm) {
				t.Errorf("after %v stopped make test, the VM tier (pid %d) is still running", sig, vm)
			}
		})
	}
}

// running: the process exists and is not a zombie.
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(s[i+1:], " Z")
}

// comm is the name of the process's program ("" once it is gone).
func comm(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
