package framework

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ControlPlane is a running hack/controlplane.sh instance.
type ControlPlane struct {
	Root       string // repository
	Dir        string // the script's <dir>: pki/, logs/, pids/, etcd-data/
	Kubeconfig string // admin (system:masters)
	Env        map[string]string
	Config     *rest.Config
	Client     kubernetes.Interface
}

// ControlPlaneOptions tune kube-controller-manager; zero values keep the
// script's defaults (see hack/controlplane.sh).
type ControlPlaneOptions struct {
	NodeMonitorGracePeriod time.Duration // --node-monitor-grace-period
	ExtraKCMArgs           string        // appended to kube-controller-manager's flags
	ExtraAPIServerArgs     string
	// KubeletClientCert makes kube-apiserver present the admin
	// certificate to kubelets (real nodes, whose kubelets authenticate
	// it: exec, logs, the node proxy).
	KubeletClientCert bool
	// AuthorizationMode is kube-apiserver's --authorization-mode (default
	// RBAC; real nodes want Node,RBAC).
	AuthorizationMode string
	// EtcdBin runs another etcd than the one hack/build-controlplane.sh
	// built (ETCD_BIN), e.g. Debian's 3.4.23, over which kube-apiserver
	// refuses watch-list.
	EtcdBin string
}

// StartControlPlane starts etcd, kube-apiserver and kube-controller-manager
// in dir with hack/controlplane.sh and waits until they are ready. They are
// stopped by PID (apiserver before etcd) in tb.Cleanup; a watchdog process
// does the same if the test binary exits without cleaning up.
func StartControlPlane(tb testing.TB, tl *Timeline, root, dir string, opts ControlPlaneOptions) *ControlPlane {
	tb.Helper()
	done := tl.Step("start the control plane (etcd, kube-apiserver, kube-controller-manager)")
	script := filepath.Join(root, "hack", "controlplane.sh")
	env := os.Environ()
	if opts.NodeMonitorGracePeriod > 0 {
		env = append(env, "NODE_MONITOR_GRACE="+opts.NodeMonitorGracePeriod.String())
	}
	if opts.ExtraKCMArgs != "" {
		env = append(env, "KCM_EXTRA_ARGS="+opts.ExtraKCMArgs)
	}
	if opts.ExtraAPIServerArgs != "" {
		env = append(env, "APISERVER_EXTRA_ARGS="+opts.ExtraAPIServerArgs)
	}
	if opts.EtcdBin != "" {
		env = append(env, "ETCD_BIN="+opts.EtcdBin)
	}
	if opts.AuthorizationMode != "" {
		env = append(env, "APISERVER_AUTHORIZATION_MODE="+opts.AuthorizationMode)
	}
	if opts.KubeletClientCert {
		env = append(env, "APISERVER_KUBELET_CLIENT=1")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := writePorts(dir); err != nil {
		tb.Fatal(err)
	}
	logPath := filepath.Join(dir, "controlplane-script.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()

	// The script runs in its own process group: a Ctrl-C (SIGINT to the
	// terminal's whole foreground group, under go test or make demo) must
	// not kill a start half-way or the stop that cleans up after it.
	stop := func() {
		cmd := exec.Command("bash", script, "stop", dir)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // finishes even if we die meanwhile
		if err := cmd.Run(); err != nil {
			tb.Errorf("hack/controlplane.sh stop %s: %v (see %s)", dir, err, logPath)
		}
	}
	// Registered before start: a start that fails half-way leaves nothing.
	tb.Cleanup(func() {
		f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0o644)
		if err == nil {
			logf = f
			defer f.Close()
		}
		t0 := time.Now()
		stop()
		tl.Logf("control plane stopped in %s", time.Since(t0).Round(time.Millisecond))
		// The data and credentials are of no use after the run and should
		// not travel with the artifacts; the logs stay.
		_ = os.RemoveAll(filepath.Join(dir, "etcd-data"))
		_ = os.RemoveAll(filepath.Join(dir, "pki"))
		if kcs, err := filepath.Glob(filepath.Join(dir, "*.kubeconfig")); err == nil {
			for _, f := range kcs {
				_ = os.Remove(f)
			}
		}
	})
	watchdog(tb, script, dir)

	cmd := exec.Command("bash", script, "start", dir)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	// Dies with us (the watchdog then stops what it started); a Ctrl-C
	// that we handle lets it finish, then the cleanup stops everything.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	waited := acquireStart()
	if waited > time.Second {
		tl.Logf("waited %s for another test's control plane to finish starting", waited.Round(time.Millisecond))
	}
	err = cmd.Run()
	releaseStart()
	if err != nil {
		tb.Fatalf("hack/controlplane.sh start %s: %v\n%s", dir, err, tail(logPath, 40))
	}
	cp := &ControlPlane{Root: root, Dir: dir, Kubeconfig: filepath.Join(dir, "admin.kubeconfig")}
	cp.Env, err = readEnvFile(filepath.Join(dir, "env"))
	if err != nil {
		tb.Fatal(err)
	}
	// The admin kubeconfig's cluster and user, from the env file (no
	// clientcmd: it would pull in flag libraries the module does not need).
	cp.Config = &rest.Config{
		Host: cp.Env["KUBE_APISERVER_URL"],
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   cp.Env["KUBE_CA_FILE"],
			CertFile: cp.Env["KUBE_ADMIN_CERT"],
			KeyFile:  cp.Env["KUBE_ADMIN_KEY"],
		},
		QPS: 200, Burst: 400, UserAgent: "rds-csi-e2e",
	}
	cp.Client, err = kubernetes.NewForConfig(cp.Config)
	if err != nil {
		tb.Fatal(err)
	}
	done()
	tl.Logf("kube-apiserver at %s, admin kubeconfig %s", cp.Env["KUBE_APISERVER_URL"], cp.Kubeconfig)
	return cp
}

// writePorts gives the control plane in dir its ports from FreePort, in
// the <dir>/ports file hack/controlplane.sh reads (it picks others only
// when one of them was taken meanwhile by another process).
func writePorts(dir string) error {
	var b strings.Builder
	for _, name := range []string{"ETCD_PORT", "ETCD_PEER_PORT", "APISERVER_PORT", "KCM_PORT"} {
		p, err := FreePort()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s=%d\n", name, p)
	}
	return os.WriteFile(filepath.Join(dir, "ports"), []byte(b.String()), 0o644)
}

// startSlots bounds how many control planes start at once in this test
// binary: RDS_CSI_E2E_STARTS, default 2. A start is the costly part of a
// control plane (kube-apiserver takes a core for seconds); once up, a
// scenario that waits costs little. Tests side by side (go test -parallel)
// queue here for their start instead of all starting together on a small
// machine, which slowed every start and every waiting test beside them.
var startSlots = make(chan struct{}, controlPlaneStarts())

func controlPlaneStarts() int {
	if n, err := strconv.Atoi(os.Getenv("RDS_CSI_E2E_STARTS")); err == nil && n > 0 {
		return n
	}
	return 2
}

// acquireStart takes a start slot and says how long it waited for one.
func acquireStart() time.Duration {
	t0 := time.Now()
	startSlots <- struct{}{}
	return time.Since(t0)
}

func releaseStart() { <-startSlots }

// watchdog starts a detached shell that runs "controlplane.sh stop" once
// this test binary is gone, whatever way it went (a -timeout panic skips
// every cleanup). A normal cleanup ends the watchdog by its PID first.
func watchdog(tb testing.TB, script, dir string) {
	tb.Helper()
	self := strconv.Itoa(os.Getpid())
	sh := `while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec bash "$2" stop "$3"`
	cmd := exec.Command("bash", "-c", sh, "watchdog", self, script, dir)
	logf, err := os.OpenFile(filepath.Join(dir, "watchdog.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Fatalf("start the control-plane watchdog: %v", err)
	}
	logf.Close()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	// Cleanups run last-registered first: the watchdog ends before the stop.
	tb.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-exited
		}
	})
}

func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimPrefix(strings.TrimSpace(sc.Text()), "export ")
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	return env, sc.Err()
}

// tail returns the last n lines of a file, for failure messages.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
