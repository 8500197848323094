// Command demo is `make demo`: the driver's whole story on a real,
// kubelet-less control plane, told as a timeline. It starts etcd,
// kube-apiserver and kube-controller-manager, the RDS simulator, the driver
// binary with its sidecars under the ServiceAccount and RBAC of
// manifests/base (exactly as the e2e suite does, through e2e/framework),
// two fake kubelets, and walks one volume through provision, attach, node
// failure, fenced handoff, snapshot and cleanup. Every API object change is
// printed as it happens; a summary table ends the run. Ctrl-C stops
// everything it started (the cleanups of the framework run as after a test).
//
// Run it with `make demo` (hack/demo.sh builds what is missing first). The
// full timeline and every component's log stay in e2e/artifacts/demo-<time>/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/srvlab/rds-csi/e2e/framework"
)

func main() {
	verbose := flag.Bool("v", false, "print every line of the timeline (waits, process starts, all events)")
	driverBin := flag.String("driver", "bin/rds-csi-driver", "driver binary (as built by `make build`); when missing, the framework builds one with -race")
	grace := flag.Duration("node-monitor-grace", 8*time.Second, "kube-controller-manager --node-monitor-grace-period: how long a silent node stays Ready")
	flag.Parse()

	if os.Getenv("RDS_CSI_E2E_DRIVER_BIN") == "" {
		if abs, err := filepath.Abs(*driverBin); err == nil {
			if st, err := os.Stat(abs); err == nil && st.Mode().IsRegular() {
				_ = os.Setenv("RDS_CSI_E2E_DRIVER_BIN", abs)
			}
		}
	}

	p := newPrinter(os.Stdout, *verbose)
	r := newRunner(context.Background(), "demo", p.line)
	d := &demo{p: p, r: r, grace: *grace, start: time.Now(), pids: map[string]int{}}

	// Ctrl-C (SIGINT to the whole foreground process group: make, this
	// program; the driver, sidecars and control plane run in their own
	// process groups and sessions, so they wait to be stopped in order).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		n := 0
		for s := range sigs {
			n++
			switch n {
			case 1:
				p.say(yellow+bold, "\n%s: stopping everything this demo started (driver, sidecars, control plane, simulator)…", signalName(s))
				r.interrupt()
			case 2:
				p.say(yellow, "still stopping (%d cleanups left); press Ctrl-C once more to exit at once (the control plane's watchdog and the children's parent-death signal still stop everything)", r.pendingCleanups())
			default:
				p.say(red, "exiting without waiting for the cleanups")
				os.Exit(130)
			}
		}
	}()

	p.say(bold, "rds-csi demo: one volume on a real control plane (etcd, kube-apiserver, kube-controller-manager), the driver binary with its sidecars, and the RDS simulator over SSH")
	p.say(dim, "times on the left are seconds since the control plane started; lines in colour are API objects changing (from a watch)")

	r.run(d.scenario)

	// Stop everything the framework started, newest first, as after a test.
	p.header(totalSteps, totalSteps, "stop everything", "driver, sidecars, snapshot-controller, simulator, kube-controller-manager, kube-apiserver, etcd (by PID)")
	// hack/controlplane.sh removes its pid files as it stops a component:
	// note them first, to check afterwards that every process is gone.
	if dir := p.artifactDir(); dir != "" {
		d.recordPIDFiles(filepath.Join(dir, "controlplane", "pids"))
	}
	stopStart := time.Now()
	r.runCleanups(nil)
	stopTook := time.Since(stopStart)
	alive := d.aliveProcesses()
	stopRow := &stepRecord{title: "stop everything", took: stopTook, objects: "-", status: "ok"}
	if len(alive) > 0 {
		// A cleanup failed: stop what is left anyway, then say so.
		p.say(red, "   still running after the cleanups: %s; stopping them again", strings.Join(alive, ", "))
		d.stopLeftovers(p.artifactDir())
		stopRow.status, stopRow.result = "FAILED", "left running by the cleanups: "+strings.Join(alive, ", ")
		if again := d.aliveProcesses(); len(again) > 0 {
			stopRow.result += "; still running: " + strings.Join(again, ", ")
		} else {
			stopRow.result += "; stopped on a second attempt"
		}
		r.Fail()
	} else {
		stopRow.result = fmt.Sprintf("%d processes stopped, none left", len(d.pids))
		names := make([]string, 0, len(d.pids))
		for n := range d.pids {
			names = append(names, n)
		}
		sort.Strings(names)
		p.say("", "   · checked gone: %s", strings.Join(names, ", "))
	}
	if stopRow.status == "ok" {
		p.say(green, "   ✔ %s  %s", fmtDur(stopRow.took), stopRow.result)
	} else {
		p.say(red, "   ✘ %s  %s", fmtDur(stopRow.took), stopRow.result)
	}
	d.rows = append(d.rows, stopRow)

	fmt.Println()
	p.say(bold, "Summary")
	p.table(d.rows, time.Since(d.start))
	width := 0
	for _, n := range d.numbers {
		width = max(width, utf8.RuneCountInString(n[0]))
	}
	for _, n := range d.numbers {
		p.say("", "  %s:%s %s", n[0], strings.Repeat(" ", width-utf8.RuneCountInString(n[0])), n[1])
	}
	if d.artifacts != "" {
		p.say(dim, "full timeline and every component's log: %s", d.artifacts)
	}
	switch {
	case r.wasInterrupted() && !r.Failed():
		p.say(yellow, "interrupted; everything the demo started has been stopped")
		os.Exit(130)
	case r.Failed():
		p.say(red+bold, "FAILED (see the lines marked ERROR above and the artifacts)")
		os.Exit(1)
	default:
		p.say(green+bold, "demo finished: every step above ran against the real API server, the driver binary and the simulator")
	}
}

func signalName(s os.Signal) string {
	if s == os.Interrupt {
		return "Ctrl-C"
	}
	return s.String()
}

// aliveProcesses are the recorded PIDs that still exist (zombies count as
// gone: they have exited and only wait for their parent to reap them).
func (d *demo) aliveProcesses() []string {
	var alive []string
	for name, pid := range d.pids {
		if isAlive(pid) {
			alive = append(alive, fmt.Sprintf("%s (pid %d)", name, pid))
		}
	}
	return alive
}

func isAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(f) == 0 || f[0] != "Z"
}

// recordPIDFiles notes the processes of hack/controlplane.sh's pid files.
func (d *demo) recordPIDFiles(dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			d.pids[strings.TrimSuffix(filepath.Base(f), ".pid")] = pid
		}
	}
}

// stopLeftovers is the fallback when a cleanup failed: hack/controlplane.sh
// stop once more (by its pid files, in order), then SIGKILL for whatever
// recorded process is still there.
func (d *demo) stopLeftovers(artifacts string) {
	if root, err := framework.RepoRoot(); err == nil && artifacts != "" {
		cmd := exec.Command("bash", filepath.Join(root, "hack", "controlplane.sh"), "stop", filepath.Join(artifacts, "controlplane"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		_ = cmd.Run()
	}
	for _, pid := range d.pids {
		if isAlive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(d.aliveProcesses()) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // polling for process exit, not synchronising a test
	}
}
