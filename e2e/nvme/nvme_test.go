//go:build nvmevm

// The NVMe/TCP tier of the test suite (make e2e-nvme): it
// boots the VM of e2e/vm on Debian's 6.12 kernel twice, with
// nvme_core.multipath=Y and =N, and once on 6.1 (see boots), and runs
// the guest tests of pkg/nvme, pkg/csi and csi-sanity against the shipped
// binaries (sanity_vm_test.go) and the storage fencing proofs
// (fence_vm_test.go; fence_return_vm_test.go: a fenced attachment's held
// writes never land when the volume comes back to its node), and issue
// 27's per-volume write counters (rdshealth_vm_test.go: a volume fio
// writes shows writes on its PV's series, the other none), and issue 26's
// authenticated attachments (auth_vm_test.go; all build tag nvmevm)
// inside against
// the real kernel target (nvmet, driven by rds-sim's exporter) and
// initiator (nvme-tcp). The guest binaries are built here with `go test
// -c`; the guest runs them from the host's root, shared read-only.
package nvme

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/srvlab/rds-csi/e2e/vm"
)

// guestRun is one test binary run inside a boot.
type guestRun struct {
	pkg  string // package to build with -tags nvmevm
	run  string // -test.run
	name string // binary name
}

// kernel61 is Debian bookworm's 6.1 kernel package: no NVMe in-band
// authentication, and a kernel that keeps reconnecting a fenced
// attachment's controller after the target refused it (its writes held
// until ctrl_loss_tmo). 6.12 gives the controller up at the first refusal,
// which carries Do Not Retry ("A's controller gone 1.1 s after the fence",
// TestVMFenceCutsWriter), so the held writes that
// TestVMFencedAttachmentReturns is about cannot arise there: it runs on
// 6.1, where they do.
const kernel61 = "linux-image-6.1.0-56-amd64"

// boots: on the pinned 6.12 kernel, multipath Y runs everything; N runs
// what depends on the device naming (connect and discovery, stage and
// publish, a path that bounces, a fenced writer's device, an
// authenticated attachment's device). The 6.1 boot runs what needs that
// kernel: the held writes of a fenced attachment, and the node's refusal
// of authentication on a kernel without it.
var boots = []struct {
	name, kernel, multipath string // kernel: "" is hack/nvme-vm.sh's pinned package
	runs                    []guestRun
}{
	{"multipath=Y", "", "Y", []guestRun{
		{"./pkg/nvme", "^TestVM", "nvme.test"},
		{"./pkg/csi", "^(TestNode|TestVM|TestSanity)", "csi.test"},
		{"./e2e/nvme", "^(TestVMSanityBinaries|TestVMFenceCutsWriter|TestVMAllowedHostChangeOnly|TestVMSelftestData|TestVMVolumeWriteIOPS|TestVMAuthenticatedExport|TestVMNodePluginAuthReport)$", "e2e-nvme.test"},
	}},
	{"multipath=N", "", "N", []guestRun{
		{"./pkg/nvme", "^TestVM", "nvme.test"},
		{"./pkg/csi", "^(TestNodeFilesystemLifecycle|TestNodeBlockVolume|TestNodeExpandVolume|TestVMNodePathDownAndBack)$", "csi.test"},
		{"./e2e/nvme", "^(TestVMFenceCutsWriter|TestVMAuthenticatedExport)$", "e2e-nvme.test"},
	}},
	{"kernel=6.1", kernel61, "Y", []guestRun{
		{"./pkg/nvme", "^TestVMAuthUnsupportedMatchesKernel$", "nvme.test"},
		{"./e2e/nvme", "^(TestVMFencedAttachmentReturns|TestVMNodePluginAuthReport|TestVMSelftestData)$", "e2e-nvme.test"},
	}},
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// unavailable skips outside CI and fails in CI, where the tier must run.
func unavailable(t *testing.T, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and the NVMe/TCP VM tier cannot run: %v", err)
	}
	t.Skipf("skipping the NVMe/TCP VM tier: %v", err)
}

func TestNVMeTCPInVM(t *testing.T) {
	if os.Getenv("RDS_NVME_VM") == "1" {
		t.Skip("inside the VM already")
	}
	root := repoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 35*time.Minute)
	defer cancel()
	start := time.Now()
	// Each kernel the boots name, prepared once.
	type kernel struct {
		prep vm.Prepared
		ko   string // nvme-tcp.ko(.xz) in the unpacked package
	}
	kernels := map[string]kernel{}
	for _, b := range boots {
		if _, done := kernels[b.kernel]; done {
			continue
		}
		prep, err := vm.Prepare(ctx, root, b.kernel)
		if err != nil {
			unavailable(t, err)
		}
		t.Logf("kernel package %s (NVMe in-band authentication: %v)", prep.KernelPackage, prep.NVMeAuth)
		if err := vm.Check(vm.Config{Kernel: prep.Kernel, Initrd: prep.Initrd}); err != nil {
			unavailable(t, err)
		}
		// nvme-tcp.ko, or nvme-tcp.ko.xz where the package compresses its
		// modules (6.12): the guest test loads it with finit_module.
		ko, err := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(prep.Kernel)), "lib", "modules", "*", "kernel", "drivers", "nvme", "host", "nvme-tcp.ko*"))
		if err != nil || len(ko) != 1 {
			t.Fatalf("nvme-tcp.ko in the unpacked kernel: %v %v", ko, err)
		}
		kernels[b.kernel] = kernel{prep: prep, ko: ko[0]}
	}
	cache := filepath.Join(root, ".cache", "nvme-vm")
	base := vm.Config{Kernel: kernels[""].prep.Kernel, Initrd: kernels[""].prep.Initrd}
	bin := filepath.Join(cache, "bin")
	// The guest runs the binaries and loads nvme-tcp.ko by their host paths
	// (shown over the guest's own /tmp when the checkout is there).
	base.HostDirs = []string{cache}
	// KVM or TCG, decided once for both boots (a probe boot under
	// RDS_CSI_VM_KVM=auto, up to 30 s where KVM hangs, so beside the
	// builds); a failed boot later is a failure, not a retry.
	type choice struct {
		accel vm.Accel
		err   error
	}
	chosen := make(chan choice, 1)
	go func() {
		a, err := vm.ChooseAccel(ctx, base)
		chosen <- choice{a, err}
	}()

	// Build each guest binary once.
	built := map[string]bool{}
	for _, b := range boots {
		for _, r := range b.runs {
			if built[r.name] {
				continue
			}
			cmd := exec.CommandContext(ctx, "go", "test", "-c", "-tags", "nvmevm", "-o", filepath.Join(bin, r.name), r.pkg)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("building %s: %v\n%s", r.pkg, err, out)
			}
			built[r.name] = true
		}
	}
	// The shipped binaries, for csi-sanity against them (sanity_vm_test.go)
	// and rdsctl selftest -data (selftest_vm_test.go).
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin+"/", "./cmd/rds-sim", "./cmd/rds-csi-driver", "./cmd/rdsctl")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the binaries: %v\n%s", err, out)
	}
	c := <-chosen
	if c.err != nil {
		if errors.Is(c.err, vm.ErrUnavailable) {
			unavailable(t, c.err)
		}
		t.Fatal(c.err)
	}
	t.Logf("accelerator: %s", c.accel)
	base.Accel = &c.accel
	t.Logf("kernel, initramfs and guest binaries ready after %v", time.Since(start).Round(time.Second))

	for _, b := range boots {
		t.Run(b.name, func(t *testing.T) {
			results := filepath.Join(cache, "runs", strings.ReplaceAll(b.name, "=", "-"))
			if err := os.RemoveAll(results); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(results, 0o755); err != nil {
				t.Fatal(err)
			}
			var script strings.Builder
			script.WriteString("status=0\n")
			for _, r := range b.runs {
				fmt.Fprintf(&script, "echo '### %s'\n", r.name)
				fmt.Fprintf(&script, "%s -test.run %s -test.v -test.count=1 -test.timeout 20m 2>&1 || status=1\n", vm.ShellQuote(filepath.Join(bin, r.name)), vm.ShellQuote(r.run))
			}
			script.WriteString("exit $status\n")
			k := kernels[b.kernel]
			kernelAuth := "0"
			if k.prep.NVMeAuth {
				kernelAuth = "1"
			}
			cfg := base
			cfg.Kernel, cfg.Initrd = k.prep.Kernel, k.prep.Initrd
			cfg.ResultsDir = results
			cfg.KernelArgs = []string{"nvme_core.multipath=" + b.multipath}
			res, err := vm.Run(ctx, cfg, script.String(), "RDS_NVME_VM=1", "RDS_NVME_VM_NVME_TCP_KO="+k.ko, "RDS_NVME_VM_BIN="+bin, "RDS_NVME_VM_KERNEL_NVME_AUTH="+kernelAuth)
			logFile := filepath.Join(results, "console.log")
			_ = os.WriteFile(logFile, res.Output, 0o644)
			summary := summarize(res.Output)
			t.Logf("boot %s (%s): %v (%s), console log %s\n%s", b.name, k.prep.KernelPackage, res.Elapsed.Round(time.Second), res.Accel, logFile, summary)
			if err != nil {
				if errors.Is(err, vm.ErrUnavailable) {
					unavailable(t, err)
				}
				t.Fatalf("%v\n%s", err, tail(res.Output, 60))
			}
			if res.ExitStatus != 0 {
				t.Errorf("guest tests failed (exit status %d); the failures:\n%s", res.ExitStatus, failures(res.Output))
			}
		})
	}
}

// summarize keeps the top-level results of the guest's go test -v output.
func summarize(out []byte) string {
	return keepLines(out, func(l string) bool {
		return strings.HasPrefix(l, "### ") || strings.HasPrefix(l, "--- ") || strings.HasPrefix(l, "PASS") || strings.HasPrefix(l, "FAIL") || strings.Contains(l, "csi-sanity")
	})
}

// failures keeps the lines of failed tests and their messages.
func failures(out []byte) string {
	return keepLines(out, func(l string) bool {
		return strings.Contains(l, "--- FAIL") || strings.Contains(l, "_test.go:") || strings.Contains(l, "[FAIL]") || strings.HasPrefix(l, "panic")
	})
}

func keepLines(out []byte, keep func(string) bool) string {
	var b strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if keep(sc.Text()) {
			b.WriteString(sc.Text() + "\n")
		}
	}
	return b.String()
}

func tail(out []byte, n int) string {
	lines := strings.Split(string(out), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
