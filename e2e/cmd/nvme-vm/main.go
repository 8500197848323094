// Command nvme-vm runs one shell command inside the NVMe/TCP test VM
// (package e2e/vm) and exits with its exit status:
//
//	go run ./e2e/cmd/nvme-vm [--multipath=N] [--timeout=10m] -- 'fio ...'
//
// The host's root is the guest's root (read-only; the guest's /tmp, /run and
// /etc are its own, in memory; the checkout is shown at its path even under
// /tmp); --results (default
// .cache/nvme-vm/runs/manual) is writable inside at /run/rdsvm/results
// ($RDSVM_RESULTS). --kvm (default $RDS_CSI_VM_KVM, else auto) picks the
// accelerator; auto probes KVM with a short boot and falls back to TCG.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/srvlab/rds-csi/e2e/vm"
)

func main() {
	var (
		multipath = flag.String("multipath", "Y", "nvme_core.multipath: Y or N")
		timeout   = flag.Duration("timeout", 10*time.Minute, "kill the VM after this long")
		results   = flag.String("results", ".cache/nvme-vm/runs/manual", "writable results directory shared with the guest")
		memory    = flag.Int("memory", 2048, "guest memory in MiB")
		cpus      = flag.Int("cpus", 1, "guest CPUs")
		kvm       = flag.String("kvm", "", "auto (KVM if a probe boot reaches /init, else TCG), on or off; default $"+vm.KVMEnv+", else auto")
	)
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: nvme-vm [flags] -- command...")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	status, err := run(ctx, *multipath, *results, *memory, *cpus, *kvm, strings.Join(flag.Args(), " "))
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvme-vm:", err)
		if errors.Is(err, vm.ErrUnavailable) {
			os.Exit(3)
		}
		os.Exit(1)
	}
	os.Exit(status)
}

func run(ctx context.Context, multipath, results string, memory, cpus int, kvm, command string) (int, error) {
	root, err := os.Getwd()
	if err != nil {
		return 0, err
	}
	prep, err := vm.Prepare(ctx, root, "")
	if err != nil {
		return 0, err
	}
	dir, err := filepath.Abs(results)
	if err != nil {
		return 0, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	res, err := vm.Run(ctx, vm.Config{
		Kernel: prep.Kernel, Initrd: prep.Initrd, ResultsDir: dir,
		HostDirs:  []string{root}, // the checkout, also when it is under /tmp
		MemoryMiB: memory, CPUs: cpus, KVM: kvm,
		KernelArgs: []string{"nvme_core.multipath=" + multipath},
		Console:    os.Stdout,
		Logf:       func(format string, args ...any) { fmt.Fprintf(os.Stderr, "nvme-vm: "+format+"\n", args...) },
	}, command)
	if err != nil {
		return 0, err
	}
	fmt.Fprintf(os.Stderr, "nvme-vm: exit status %d after %v (%s)\n", res.ExitStatus, res.Elapsed.Round(100*time.Millisecond), res.Accel)
	return res.ExitStatus, nil
}
