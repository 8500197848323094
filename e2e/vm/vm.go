// Package vm boots a throwaway QEMU virtual machine with a packaged Debian
// kernel to run one command against a real kernel NVMe/TCP stack (the nvmet
// target and the nvme-tcp initiator), which the test machines' own kernels
// do not have.
//
// The guest is the generated busybox initramfs of hack/nvme-vm.sh: it loads
// the modules, mounts the host's root read-only over 9p (so the guest runs
// the host's binaries: Go test binaries built with `go test -c`, mkfs, fio),
// mounts one writable results directory at the same path, and runs a shell
// script chrooted into the host's root. Run returns the script's exit status
// and console output, and kills the VM when its context ends (timeout,
// Ctrl-C). KVM is used when /dev/kvm is usable, TCG otherwise.
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

// Config describes one VM run.
type Config struct {
	Kernel string // vmlinuz (hack/nvme-vm.sh prepare prints it)
	Initrd string // the generated initramfs
	// ResultsDir is a host directory the guest can write; run.sh and
	// exit-status are kept in it. It must exist, must not be under /tmp
	// (the guest mounts a tmpfs there) and is used at the same path inside.
	ResultsDir string
	MemoryMiB  int      // default 2048
	CPUs       int      // default 1 (TCG boots one CPU fastest)
	KernelArgs []string // extra kernel command-line words, e.g. "nvme_core.multipath=N"
	// Console receives the guest's console output as it arrives (the
	// kernel's messages and the command's output); may be nil.
	Console io.Writer
	// QEMU is the emulator binary; default qemu-system-x86_64.
	QEMU string
	// KVM: "auto" (default) uses /dev/kvm when it can be opened, "on"
	// requires it, "off" never uses it.
	KVM string
}

// Result is the outcome of a run that reached the command.
type Result struct {
	ExitStatus int
	Output     []byte        // the whole console output
	Elapsed    time.Duration // launch to power-off
	KVM        bool
}

// script is written to ResultsDir/run.sh and run by /init chrooted into
// the host's root; the environment there is almost empty.
func script(command string, env []string) string {
	var b strings.Builder
	b.WriteString("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root\n")
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(v))
	}
	b.WriteString("cd /\n")
	b.WriteString(command)
	b.WriteString("\n")
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Args returns QEMU's argument list for cfg (exported for the runner's
// tests and for printing a reproducing command line).
func Args(cfg Config, kvm bool) []string {
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
	appendLine := append([]string{"console=ttyS0", "quiet", "panic=-1", "hardened_usercopy=off", "rdsvm.results=" + cfg.ResultsDir}, cfg.KernelArgs...)
	args := []string{
		// qboot instead of SeaBIOS: the firmware is most of a TCG boot.
		"-M", "pc", "-bios", "qboot.rom",
		"-m", strconv.Itoa(mem), "-smp", strconv.Itoa(cpus),
		"-kernel", cfg.Kernel, "-initrd", cfg.Initrd,
		"-append", strings.Join(appendLine, " "),
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-device", "virtio-9p-pci,fsdev=host,mount_tag=host",
		"-fsdev", "local,id=host,path=/,security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=results,mount_tag=results",
		"-fsdev", "local,id=results,path=" + cfg.ResultsDir + ",security_model=none",
	}
	if kvm {
		args = append(args, "-enable-kvm", "-cpu", "host")
	} else {
		args = append(args, "-accel", "tcg")
	}
	return args
}

// kvmUsable reports whether /dev/kvm can be opened for reading and writing.
func kvmUsable() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// Check reports why the VM cannot run here, or nil.
func Check(cfg Config) error {
	qemu := cfg.QEMU
	if qemu == "" {
		qemu = "qemu-system-x86_64"
	}
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
	if cfg.KVM == "on" && !kvmUsable() {
		return fmt.Errorf("%w: KVM was required but /dev/kvm cannot be opened", ErrUnavailable)
	}
	return nil
}

// Run boots the VM, runs command (a POSIX shell script run as root in the
// host's root, with env added) and returns its exit status and the console
// output. An error means the command did not finish: the VM could not
// start, crashed, or ctx ended first (then the VM is killed).
func Run(ctx context.Context, cfg Config, command string, env ...string) (Result, error) {
	if err := Check(cfg); err != nil {
		return Result{}, err
	}
	if cfg.ResultsDir == "" || !filepath.IsAbs(cfg.ResultsDir) {
		return Result{}, fmt.Errorf("vm: results directory %q must be an absolute path", cfg.ResultsDir)
	}
	if strings.HasPrefix(cfg.ResultsDir+"/", "/tmp/") || strings.ContainsAny(cfg.ResultsDir, " ,") {
		return Result{}, fmt.Errorf("vm: results directory %q must not be under /tmp nor contain spaces or commas", cfg.ResultsDir)
	}
	// The guest mounts the share at this path under the host's root,
	// outside the chroot, where an absolute symlink would point elsewhere.
	dir, err := filepath.EvalSymlinks(cfg.ResultsDir)
	if err != nil {
		return Result{}, fmt.Errorf("vm: results directory: %w", err)
	}
	cfg.ResultsDir = dir
	statusFile := filepath.Join(cfg.ResultsDir, "exit-status")
	if err := os.Remove(statusFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Result{}, err
	}
	if err := os.WriteFile(filepath.Join(cfg.ResultsDir, "run.sh"), []byte(script(command, env)), 0o755); err != nil {
		return Result{}, err
	}
	kvm := cfg.KVM != "off" && kvmUsable()
	qemu := cfg.QEMU
	if qemu == "" {
		qemu = "qemu-system-x86_64"
	}
	var out lockedBuffer
	var console io.Writer = &out
	if cfg.Console != nil {
		console = io.MultiWriter(&out, cfg.Console)
	}
	cmd := exec.CommandContext(ctx, qemu, Args(cfg, kvm)...)
	cmd.Stdin = nil // /dev/null: the guest reads no input
	cmd.Stdout = console
	cmd.Stderr = console
	// The VM dies with this process, even on SIGKILL, and a Ctrl-C in the
	// terminal reaches it only through ctx (its own process group).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err = cmd.Run()
	res := Result{Output: out.Bytes(), Elapsed: time.Since(start), KVM: kvm}
	if ctx.Err() != nil {
		return res, fmt.Errorf("vm: killed after %v: %w", res.Elapsed.Round(time.Second), ctx.Err())
	}
	if err != nil {
		return res, fmt.Errorf("vm: %s: %w", qemu, err)
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

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// Prepare runs hack/nvme-vm.sh prepare in the repository at repoRoot
// (downloading and unpacking the kernel package and building the
// initramfs when missing) and returns the kernel and initramfs paths.
func Prepare(ctx context.Context, repoRoot string) (kernel, initrd string, err error) {
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot, "hack", "nvme-vm.sh"), "prepare")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("%w: hack/nvme-vm.sh prepare: %v: %s", ErrUnavailable, err, strings.TrimSpace(stderr.String()))
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "KERNEL="); ok {
			kernel = v
		}
		if v, ok := strings.CutPrefix(line, "INITRD="); ok {
			initrd = v
		}
	}
	if kernel == "" || initrd == "" {
		return "", "", fmt.Errorf("%w: hack/nvme-vm.sh prepare printed no kernel/initramfs: %s", ErrUnavailable, out)
	}
	return kernel, initrd, nil
}
