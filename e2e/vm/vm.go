// Package vm boots a throwaway QEMU virtual machine with a packaged Debian
// kernel to run one command against a real kernel NVMe/TCP stack (the nvmet
// target and the nvme-tcp initiator), which the test machines' own kernels
// do not have.
//
// The guest is the generated busybox initramfs of hack/nvme-vm.sh: it loads
// the modules, mounts the host's root read-only over 9p (so the guest runs
// the host's binaries: Go test binaries built with `go test -c`, mkfs, fio),
// mounts one writable results directory at GuestResults, and runs a shell
// script chrooted into the host's root. Run returns the script's exit status
// and console output, and kills the VM when its context ends (timeout,
// Ctrl-C). Whether to use KVM is ChooseAccel's decision (RDS_CSI_VM_KVM).
//
// Paths: inside the guest, every host path is at the same place except
// those under /tmp, /run, /dev, /proc and /sys, which are the guest's own
// (tmpfs, proc, sysfs, devtmpfs). The guest's /tmp must stay a plain tmpfs:
// the tests keep their nvmet backing files there, and an overlay with the
// host's /tmp below gave nvmet namespaces of size 0. So a checkout or cache
// under /tmp is reached through Config.HostDirs: each directory named there
// that lies under /tmp is bind-mounted read-only at its own path on top of
// the guest's tmpfs (those under /run, /dev, /proc, /sys cannot be shown:
// Run refuses them). The results directory is mounted at a fixed path of
// its own (GuestResults) and no host path travels on the kernel command
// line, so any host path works (spaces and commas included).
//
// It must never touch the host beyond the results directory: the host root
// is shared read-only and the guest's /tmp, /run and /etc changes live in
// guest memory.
package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrUnavailable: this machine cannot boot the VM (no QEMU, no kernel, not
// root); the message says what is missing.
var ErrUnavailable = errors.New("the NVMe/TCP test VM cannot run on this machine")

// GuestResults is where the guest sees Config.ResultsDir (inside the
// chroot; run.sh gets it as $RDSVM_RESULTS). A fixed path under the guest's
// own /run: the results share is then found whatever the host path, and no
// guest tmpfs can cover it.
const GuestResults = "/run/rdsvm/results"

// initMarker is the line /init (hack/nvme-vm-init.sh) prints as soon as it
// runs: the kernel booted. Lines before it prove nothing: under a nested KVM
// that cannot run this kernel, the kernel's real-mode setup still prints
// "Probing EDD ... ok" (without "quiet") and then nothing comes.
const initMarker = "rdsvm: init reached"

// KVMEnv selects the accelerator when Config.KVM is empty: "auto" (the
// default), "on" or "off"; see ChooseAccel.
const KVMEnv = "RDS_CSI_VM_KVM"

// Default deadlines; see Config.ProbeTimeout and Config.InitTimeout.
const (
	// Under TCG the probe's boot reaches /init in about 10 s on the 2-core
	// machine; KVM should take a few seconds (not measured: the KVM at hand
	// hangs). 30 s leaves room for a loaded machine, and a KVM that misses
	// it is not worth using.
	DefaultProbeTimeout = 30 * time.Second
	// TCG reaches /init in 10-25 s on the 2-core machine; 5 min only cuts
	// a guest that will never get there.
	DefaultInitTimeout = 5 * time.Minute
)

// Config describes one VM run.
type Config struct {
	Kernel string // vmlinuz (hack/nvme-vm.sh prepare prints it)
	Initrd string // the generated initramfs
	// ResultsDir is a host directory the guest can write, at GuestResults
	// inside; run.sh and exit-status are kept in it. It must exist; any
	// absolute path works (under /tmp, with spaces or commas).
	ResultsDir string
	// HostDirs are host directories the command reads by their host paths
	// (test binaries, kernel modules, the checkout). Those under /tmp are
	// shown read-only at the same paths over the guest's own /tmp; the rest
	// are visible anyway. One under /run, /dev, /proc or /sys is refused.
	HostDirs   []string
	MemoryMiB  int      // default 2048
	CPUs       int      // default 1 (TCG boots one CPU fastest)
	KernelArgs []string // extra kernel command-line words, e.g. "nvme_core.multipath=N"
	// Console receives the guest's console output as it arrives (the
	// kernel's messages and the command's output); may be nil.
	Console io.Writer
	// Logf, when set, gets the host side's own notes (which accelerator
	// and why).
	Logf func(format string, args ...any)
	// QEMU is the emulator binary; default qemu-system-x86_64.
	QEMU string
	// KVM: "auto", "on" or "off"; empty means $RDS_CSI_VM_KVM, and
	// "auto" when that is unset too. See ChooseAccel.
	KVM string
	// Accel is an accelerator ChooseAccel picked earlier: Run uses it
	// as it is (one probe for several boots). Nil: Run chooses.
	Accel *Accel
	// ProbeTimeout bounds the KVM probe boot (default DefaultProbeTimeout).
	ProbeTimeout time.Duration
	// InitTimeout bounds a run's boot until /init starts (default
	// DefaultInitTimeout); past it the VM is killed and Run fails.
	InitTimeout time.Duration

	kvmDevice string // default /dev/kvm (tests)
}

// Result is the outcome of a run that reached the command.
type Result struct {
	ExitStatus int
	Output     []byte        // the whole console output
	Elapsed    time.Duration // launch to power-off
	KVM        bool
	Accel      Accel
}

// Accel is the accelerator of a run and why it was chosen.
type Accel struct {
	KVM    bool
	Reason string
}

func (a Accel) String() string {
	name := "TCG"
	if a.KVM {
		name = "KVM"
	}
	return name + " (" + a.Reason + ")"
}

// script is written to ResultsDir/run.sh and run by /init chrooted into
// the host's root; the environment there is almost empty.
func script(command string, env []string) string {
	var b strings.Builder
	b.WriteString("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root\n")
	fmt.Fprintf(&b, "export RDSVM_RESULTS=%s\n", GuestResults)
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, ShellQuote(v))
	}
	b.WriteString("cd /\n")
	b.WriteString(command)
	b.WriteString("\n")
	return b.String()
}

// ShellQuote quotes s as one word for a POSIX shell (for host paths in a
// command run in the guest: they may hold spaces).
func ShellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// qemuOptValue escapes a value inside a QEMU option list such as -fsdev's
// "local,id=x,path=...": a comma there ends the value unless doubled.
func qemuOptValue(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// Args returns QEMU's argument list for cfg (exported for the runner's
// tests and for printing a reproducing command line).
func Args(cfg Config, kvm bool) []string { return args(cfg, kvm, false) }

// args: probe boots to /init and powers off at once, with no shares.
func args(cfg Config, kvm, probe bool) []string {
	mem, cpus := cfg.MemoryMiB, cfg.CPUs
	if mem == 0 {
		mem = 2048
	}
	if cpus == 0 {
		cpus = 1
	}
	// hardened_usercopy=off: Debian's 6.1.192 nvmet-tcp trips the
	// hardened-usercopy check (kernel BUG at mm/usercopy.c, "Kernel memory
	// exposure attempt detected from page alloc" in nvmet_tcp_io_work) when
	// the initiator writes 1 MiB blocks at queue depth 16 over loopback;
	// the target side is the simulator's, not what the tier tests.
	appendLine := append([]string{"console=ttyS0", "quiet", "panic=-1", "hardened_usercopy=off"}, cfg.KernelArgs...)
	if probe {
		appendLine = append(appendLine, "rdsvm.probe=1")
	}
	a := []string{
		// qboot instead of SeaBIOS: the firmware is most of a TCG boot.
		"-M", "pc", "-bios", "qboot.rom",
		"-m", strconv.Itoa(mem), "-smp", strconv.Itoa(cpus),
		// -kernel, -initrd and -append take their value whole (no option
		// list, so no comma escaping).
		"-kernel", cfg.Kernel, "-initrd", cfg.Initrd,
		"-append", strings.Join(appendLine, " "),
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
	}
	if !probe {
		a = append(a,
			"-device", "virtio-9p-pci,fsdev=host,mount_tag=host",
			"-fsdev", "local,id=host,path=/,security_model=none,readonly=on,multidevs=remap",
			"-device", "virtio-9p-pci,fsdev=results,mount_tag=results",
			"-fsdev", "local,id=results,path="+qemuOptValue(cfg.ResultsDir)+",security_model=none",
		)
	}
	if kvm {
		a = append(a, "-enable-kvm", "-cpu", "host")
	} else {
		a = append(a, "-accel", "tcg")
	}
	return a
}

// kvmUsable reports whether /dev/kvm can be opened for reading and writing.
func kvmUsable(cfg Config) bool {
	dev := cfg.kvmDevice
	if dev == "" {
		dev = "/dev/kvm"
	}
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// kvmMode is cfg.KVM, else $RDS_CSI_VM_KVM, else "auto"; source names
// where it came from, for messages.
func kvmMode(cfg Config) (mode, source string, err error) {
	mode, source = cfg.KVM, "KVM"
	if mode == "" {
		mode, source = os.Getenv(KVMEnv), KVMEnv
	}
	if mode == "" {
		return "auto", "default", nil
	}
	switch mode {
	case "auto", "on", "off":
		return mode, source, nil
	}
	return "", "", fmt.Errorf("vm: %s=%q: want auto, on or off", source, mode)
}

func qemuBinary(cfg Config) string {
	if cfg.QEMU != "" {
		return cfg.QEMU
	}
	return "qemu-system-x86_64"
}

// Check reports why the VM cannot run here, or nil.
func Check(cfg Config) error {
	qemu := qemuBinary(cfg)
	if _, err := exec.LookPath(qemu); err != nil {
		return fmt.Errorf("%w: %s is not installed (run hack/install-deps.sh as root: qemu-system-x86)", ErrUnavailable, qemu)
	}
	for _, f := range []string{cfg.Kernel, cfg.Initrd} {
		if f == "" {
			return fmt.Errorf("%w: kernel and initramfs are required (hack/nvme-vm.sh prepare)", ErrUnavailable)
		}
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%w: %v (hack/nvme-vm.sh prepare)", ErrUnavailable, err)
		}
	}
	if os.Geteuid() != 0 {
		// The guest runs the host's binaries as root over a 9p share with
		// security_model=none, which must read every file of the host root.
		return fmt.Errorf("%w: it must run as root to share the host's root read-only", ErrUnavailable)
	}
	if mode, source, err := kvmMode(cfg); err == nil && mode == "on" && !kvmUsable(cfg) {
		return fmt.Errorf("%w: KVM was required (%s=on) but /dev/kvm cannot be opened", ErrUnavailable, source)
	}
	return nil
}

// tmpBindsFile, in the results directory, lists the HostDirs under /tmp
// for /init, one per line, relative to /tmp.
const tmpBindsFile = "tmp-binds"

// underDir reports whether p is dir or below it.
func underDir(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// tmpBinds checks that the guest can be shown each of dirs at its host path
// and returns those under /tmp, relative to it (symlinks such as /var/run
// resolved first).
func tmpBinds(dirs []string) ([]string, error) {
	var rels []string
	for _, d := range dirs {
		p, err := filepath.Abs(d)
		if err != nil {
			return nil, err
		}
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		for _, own := range []string{"/run", "/dev", "/proc", "/sys"} {
			if underDir(p, own) {
				return nil, fmt.Errorf("vm: %s is under %s, which the guest mounts its own filesystem over, so the guest cannot see it; move it (a checkout or cache anywhere else works, /tmp included)", d, own)
			}
		}
		if !underDir(p, "/tmp") {
			continue
		}
		if p == "/tmp" {
			return nil, fmt.Errorf("vm: host directory /tmp: the guest's /tmp stays its own; name the directories under it that the guest needs")
		}
		if strings.ContainsAny(p, "\n\r") {
			return nil, fmt.Errorf("vm: host directory %q: /init reads one path per line; a path with a line break cannot be shown", d)
		}
		rels = append(rels, strings.TrimPrefix(p, "/tmp/"))
	}
	return rels, nil
}

// ChooseAccel decides between KVM and TCG for cfg. "off": TCG. "on": KVM
// without a probe (an error when /dev/kvm cannot be opened; a KVM that
// cannot boot the guest then fails the run at its InitTimeout). "auto":
// KVM only after a probe boot of this kernel and initramfs under KVM
// reached /init within ProbeTimeout, TCG otherwise, with the reason. A
// /dev/kvm that opens is not a KVM that boots: on a machine that is itself
// a VM, `-cpu host` can abort at once ("failed to set MSR 0x10a") or hang
// silently after the firmware. Callers that boot several times choose once
// and pass the result in Config.Accel. The probe decides; a run that fails
// later is never retried on TCG (that would hide a real failure).
func ChooseAccel(ctx context.Context, cfg Config) (Accel, error) {
	mode, source, err := kvmMode(cfg)
	if err != nil {
		return Accel{}, err
	}
	switch mode {
	case "off":
		return Accel{Reason: source + "=off"}, nil
	case "on":
		if !kvmUsable(cfg) {
			return Accel{}, fmt.Errorf("%w: KVM was required (%s=on) but /dev/kvm cannot be opened", ErrUnavailable, source)
		}
		return Accel{KVM: true, Reason: source + "=on, not probed"}, nil
	}
	if !kvmUsable(cfg) {
		return Accel{Reason: "/dev/kvm cannot be opened"}, nil
	}
	ok, why, err := probeKVM(ctx, cfg)
	if err != nil {
		return Accel{}, err
	}
	if !ok {
		return Accel{Reason: "KVM probe failed: " + why}, nil
	}
	return Accel{KVM: true, Reason: "KVM probe: " + why}, nil
}

// probeKVM boots cfg's kernel and initramfs under KVM with rdsvm.probe=1
// (/init prints initMarker and powers off) and reports whether /init was
// reached before QEMU exited or ProbeTimeout ran out. An error only when
// ctx ended.
func probeKVM(ctx context.Context, cfg Config) (ok bool, why string, err error) {
	timeout := cfg.ProbeTimeout
	if timeout == 0 {
		timeout = DefaultProbeTimeout
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := newMarkerWriter(initMarker)
	cmd := qemuCommand(pctx, cfg, args(cfg, true, true), out)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return false, fmt.Sprintf("%s did not start: %v", cmd.Path, err), nil
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The VM is killed (pctx) and reaped on every return.
	defer func() { cancel(); <-exited }()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	select {
	case <-out.seen:
		return true, fmt.Sprintf("a guest reached /init under KVM in %v", time.Since(start).Round(100*time.Millisecond)), nil
	case err := <-exited:
		exited <- err // for the deferred reap
		if out.hasMarker() {
			return true, fmt.Sprintf("a guest reached /init under KVM in %v", time.Since(start).Round(100*time.Millisecond)), nil
		}
		return false, fmt.Sprintf("QEMU exited (%v) before the guest's /init ran: %s", err, lastLines(out.Bytes(), 3)), nil
	case <-deadline.C:
		return false, fmt.Sprintf("no guest /init within %v under KVM (console so far: %s)", timeout, lastLines(out.Bytes(), 3)), nil
	case <-ctx.Done():
		return false, "", fmt.Errorf("vm: KVM probe: %w", ctx.Err())
	}
}

// qemuCommand is QEMU with args, its output into out.
func qemuCommand(ctx context.Context, cfg Config, args []string, out io.Writer) *exec.Cmd {
	cmd := exec.CommandContext(ctx, qemuBinary(cfg), args...)
	cmd.Stdin = nil // /dev/null: the guest reads no input
	cmd.Stdout = out
	cmd.Stderr = out
	// The VM dies with this process, even on SIGKILL, and a Ctrl-C in the
	// terminal reaches it only through ctx (its own process group).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(string(b), "\r", "")), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	s := strings.Join(lines, " | ")
	if s == "" {
		return "nothing"
	}
	return fmt.Sprintf("%q", s)
}

// Run boots the VM, runs command (a POSIX shell script run as root in the
// host's root, with env added) and returns its exit status and the console
// output. An error means the command did not finish: the VM could not
// start, did not reach /init within InitTimeout, crashed, or ctx ended
// first (then the VM is killed).
func Run(ctx context.Context, cfg Config, command string, env ...string) (Result, error) {
	if err := Check(cfg); err != nil {
		return Result{}, err
	}
	if cfg.ResultsDir == "" || !filepath.IsAbs(cfg.ResultsDir) {
		return Result{}, fmt.Errorf("vm: results directory %q must be an absolute path", cfg.ResultsDir)
	}
	// QEMU shares what the path names; resolving it here names a moved
	// or removed target in the error instead of in QEMU's.
	dir, err := filepath.EvalSymlinks(cfg.ResultsDir)
	if err != nil {
		return Result{}, fmt.Errorf("vm: results directory: %w", err)
	}
	cfg.ResultsDir = dir
	binds, err := tmpBinds(cfg.HostDirs)
	if err != nil {
		return Result{}, err
	}
	var list strings.Builder
	for _, b := range binds {
		list.WriteString(b + "\n")
	}
	if err := os.WriteFile(filepath.Join(cfg.ResultsDir, tmpBindsFile), []byte(list.String()), 0o644); err != nil {
		return Result{}, err
	}
	statusFile := filepath.Join(cfg.ResultsDir, "exit-status")
	if err := os.Remove(statusFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Result{}, err
	}
	if err := os.WriteFile(filepath.Join(cfg.ResultsDir, "run.sh"), []byte(script(command, env)), 0o755); err != nil {
		return Result{}, err
	}
	var accel Accel
	if cfg.Accel != nil {
		accel = *cfg.Accel
	} else {
		if accel, err = ChooseAccel(ctx, cfg); err != nil {
			return Result{}, err
		}
		if cfg.Logf != nil {
			cfg.Logf("vm: accelerator %s", accel)
		}
	}
	initTimeout := cfg.InitTimeout
	if initTimeout == 0 {
		initTimeout = DefaultInitTimeout
	}
	out := newMarkerWriter(initMarker)
	var console io.Writer = out
	if cfg.Console != nil {
		console = io.MultiWriter(out, cfg.Console)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := qemuCommand(rctx, cfg, Args(cfg, accel.KVM), console)
	// A guest that never reaches /init (a KVM that cannot run it, forced
	// with "on") is killed instead of hanging until ctx ends.
	noInit := make(chan struct{})
	watchDone := make(chan struct{})
	defer close(watchDone)
	go func() {
		t := time.NewTimer(initTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			close(noInit)
			cancel()
		case <-out.seen:
		case <-watchDone:
		}
	}()
	start := time.Now()
	err = cmd.Run()
	res := Result{Output: out.Bytes(), Elapsed: time.Since(start), KVM: accel.KVM, Accel: accel}
	select {
	case <-noInit:
		if !out.hasMarker() {
			return res, fmt.Errorf("vm: the guest did not reach /init within %v with %s; killed it (RDS_CSI_VM_KVM=off forces TCG)", initTimeout, accel)
		}
	default:
	}
	if ctx.Err() != nil {
		return res, fmt.Errorf("vm: killed after %v: %w", res.Elapsed.Round(time.Second), ctx.Err())
	}
	if err != nil {
		return res, fmt.Errorf("vm: %s: %w", qemuBinary(cfg), err)
	}
	b, err := os.ReadFile(statusFile)
	if err != nil {
		return res, fmt.Errorf("vm: the guest powered off without finishing the command (no exit status; see the console output): %w", err)
	}
	res.ExitStatus, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return res, fmt.Errorf("vm: bad exit status %q", b)
	}
	return res, nil
}

// markerWriter keeps what is written and closes seen once marker appears.
type markerWriter struct {
	marker []byte
	seen   chan struct{}

	mu    sync.Mutex
	buf   bytes.Buffer
	found bool
}

func newMarkerWriter(marker string) *markerWriter {
	return &markerWriter{marker: []byte(marker), seen: make(chan struct{})}
}

func (w *markerWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	from := max(0, w.buf.Len()-len(w.marker)+1)
	w.buf.Write(p)
	if !w.found && bytes.Contains(w.buf.Bytes()[from:], w.marker) {
		w.found = true
		close(w.seen)
	}
	return len(p), nil
}

func (w *markerWriter) hasMarker() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.found
}

func (w *markerWriter) Bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes())
}

// Prepared is what hack/nvme-vm.sh prepare made ready.
type Prepared struct {
	Kernel string // vmlinuz
	Initrd string // the generated initramfs
	// NVMeAuth: the kernel package's config has NVMe in-band
	// authentication for host and target (CONFIG_NVME_HOST_AUTH or, before
	// 6.7, CONFIG_NVME_AUTH; CONFIG_NVME_TARGET_AUTH). The guest tests
	// check the kernel they run on against it.
	NVMeAuth bool
	// KernelPackage is the Debian package the kernel came from.
	KernelPackage string
}

// Prepare runs hack/nvme-vm.sh prepare in the repository at repoRoot
// (downloading and unpacking the kernel package and building the
// initramfs when missing) and returns what it made ready. kernelPackage
// picks the Debian kernel package; "" is the script's pinned one, or
// NVME_VM_KERNEL_PACKAGE from the environment.
func Prepare(ctx context.Context, repoRoot, kernelPackage string) (Prepared, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot, "hack", "nvme-vm.sh"), "prepare")
	if kernelPackage != "" {
		cmd.Env = append(os.Environ(), "NVME_VM_KERNEL_PACKAGE="+kernelPackage)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Prepared{}, fmt.Errorf("%w: hack/nvme-vm.sh prepare: %v: %s", ErrUnavailable, err, strings.TrimSpace(stderr.String()))
	}
	var p Prepared
	for _, line := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "KERNEL":
			p.Kernel = v
		case "INITRD":
			p.Initrd = v
		case "KERNEL_NVME_AUTH":
			p.NVMeAuth = v == "1"
		case "KERNEL_PACKAGE":
			p.KernelPackage = v
		}
	}
	if p.Kernel == "" || p.Initrd == "" {
		return Prepared{}, fmt.Errorf("%w: hack/nvme-vm.sh prepare printed no kernel/initramfs: %s", ErrUnavailable, out)
	}
	return p, nil
}
