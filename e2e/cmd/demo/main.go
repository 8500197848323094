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
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

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
	d := &demo{p: p, r: r, grace: *grace, start: time.Now()}

	// Ctrl-C (SIGINT to the whole foreground process group: make, this
	// program; the driver, sidecars and control plane run in their own
	// process groups and sessions, so they wait to be stopped in order).
	var interrupted atomic.Bool
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		n := 0
		for s := range sigs {
			n++
			switch n {
			case 1:
				interrupted.Store(true)
				p.say(yellow+bold, "\n%s: stopping everything this demo started (driver, sidecars, control plane, simulator)…", signalName(s))
				r.cancel()
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
	stopStart := time.Now()
	r.runCleanups(nil)
	stopTook := time.Since(stopStart)
	alive := d.aliveProcesses()
	stopRow := &stepRecord{title: "stop everything", took: stopTook, objects: "-", status: "ok"}
	if len(alive) > 0 {
		stopRow.status, stopRow.result = "FAILED", "still running: "+strings.Join(alive, ", ")
		r.Fail()
	} else {
		stopRow.result = fmt.Sprintf("%d processes stopped, none left", len(d.pids))
	}
	p.say(dim, "   %s", stopRow.result)
	d.rows = append(d.rows, stopRow)

	fmt.Println()
	p.say(bold, "Summary")
	p.table(d.rows, time.Since(d.start))
	for _, n := range d.numbers {
		p.say("", "  %s", n)
	}
	if d.artifacts != "" {
		p.say(dim, "full timeline and every component's log: %s", d.artifacts)
	}
	switch {
	case interrupted.Load():
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
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			continue
		}
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue
			}
		}
		alive = append(alive, fmt.Sprintf("%s (pid %d)", name, pid))
	}
	return alive
}

// recordControlPlanePIDs reads hack/controlplane.sh's pid files.
func (d *demo) recordControlPlanePIDs(cp *framework.ControlPlane) {
	files, _ := filepath.Glob(filepath.Join(cp.Dir, "pids", "*.pid"))
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
