package framework

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Process is a component the harness runs as a child: the driver, a
// sidecar. Its output goes to a log file in the artifact directory.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // valid after done is closed
	paused  atomic.Bool
}

// StartProcess runs bin with args, output appended to logPath. The child
// gets its own process group and SIGKILL when the test binary dies
// (Pdeathsig), and is stopped in tb.Cleanup.
func StartProcess(tb testing.TB, tl *Timeline, name, logPath, bin string, args ...string) *Process {
	tb.Helper()
	p, err := startProcess(name, logPath, bin, args...)
	if err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	tl.Logf("started %s (pid %d, log %s)", name, p.Pid(), logPath)
	tb.Cleanup(func() {
		if err := p.Stop(15 * time.Second); err != nil {
			tb.Errorf("stop %s: %v", name, err)
		}
		tl.Logf("stopped %s (pid %d): %v", name, p.Pid(), p.ExitErr())
	})
	return p
}

func startProcess(name, logPath, bin string, args ...string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "==== %s start: %s %q\n", time.Now().UTC().Format(time.RFC3339Nano), bin, args)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		fmt.Fprintf(logf, "==== %s exit: %v\n", time.Now().UTC().Format(time.RFC3339Nano), p.err)
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited says whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitErr is how the process ended (nil while it runs or after a clean exit).
func (p *Process) ExitErr() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Pause stops the process and everything in its process group with
// SIGSTOP, as a frozen container (cgroup freezer) or a VM stall would:
// no timer, no lease renewal, no reply; connections stay open.
func (p *Process) Pause() error {
	if p.Exited() {
		return fmt.Errorf("%s (pid %d) has exited", p.Name, p.Pid())
	}
	p.paused.Store(true)
	if err := syscall.Kill(-p.Pid(), syscall.SIGSTOP); err != nil {
		return err
	}
	// SIGSTOP is delivered asynchronously: a busy multi-threaded process
	// runs on for a while (seen: 18 ms, enough to answer an RPC). A test
	// that acts "while it sleeps" must only act once every thread is
	// stopped.
	return waitStopped(p.Pid(), 10*time.Second)
}

// waitStopped waits until every thread of pid is in the stopped state
// ('T' in /proc/<pid>/task/<tid>/stat), polling; an error after timeout.
func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		stopped, err := allThreadsStopped(pid)
		if err != nil || stopped {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d: not every thread stopped %s after SIGSTOP", pid, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

func allThreadsStopped(pid int) (bool, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, err
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			continue // the thread exited
		}
		// pid (comm) state ...: the state follows the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return false, fmt.Errorf("pid %d: unreadable stat %q", pid, b)
		}
		if st := b[i+2]; st != 'T' && st != 't' {
			return false, nil
		}
	}
	return true, nil
}

// Resume continues a paused process group with SIGCONT.
func (p *Process) Resume() error {
	if p.Exited() {
		return nil
	}
	p.paused.Store(false)
	return syscall.Kill(-p.Pid(), syscall.SIGCONT)
}

// Stop sends SIGTERM and waits up to grace for the exit, then SIGKILL.
// Stopping an exited process is a no-op; a paused one is continued after
// the SIGTERM, so that it gets it.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	if p.paused.Load() {
		_ = p.Resume()
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	p.Kill()
	return fmt.Errorf("%s (pid %d) ignored SIGTERM for %s and was killed", p.Name, p.Pid(), grace)
}

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (p *Process) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}
