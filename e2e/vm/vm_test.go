package vm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestArgs(t *testing.T) {
	cfg := Config{Kernel: "/k", Initrd: "/i", ResultsDir: "/r", KernelArgs: []string{"nvme_core.multipath=N"}}
	tests := []struct {
		kvm       bool
		want, not string
	}{
		{false, "-accel tcg", "-enable-kvm"},
		{true, "-enable-kvm", "-accel tcg"},
	}
	for _, tt := range tests {
		got := strings.Join(Args(cfg, tt.kvm), " ")
		for _, w := range []string{tt.want, "hardened_usercopy=off nvme_core.multipath=N", "path=/,security_model=none,readonly=on", "path=/r,security_model=none", "-m 2048"} {
			if !strings.Contains(got, w) {
				t.Errorf("kvm=%v: args %q lack %q", tt.kvm, got, w)
			}
		}
		if strings.Contains(got, tt.not) {
			t.Errorf("kvm=%v: args %q contain %q", tt.kvm, got, tt.not)
		}
	}
}

// A results directory anywhere (a checkout under /tmp, a path with spaces
// or commas) reaches QEMU as one -fsdev value, its commas doubled (QEMU's
// escape in option lists), and never the kernel command line, where a
// space would split it.
func TestArgsResultsPath(t *testing.T) {
	for _, dir := range []string{"/tmp/rds-csi/.cache/nvme-vm/runs/x", "/tmp/rds csi/runs/x", "/srv/a,b/c,,d", "/root/src/github.com/srvlab/rds csi,x/runs"} {
		args := Args(Config{Kernel: "/k", Initrd: "/i", ResultsDir: dir}, false)
		var fsdev, appendLine string
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "-fsdev":
				if o := qemuOpts(args[i+1]); o["id"] == "results" {
					fsdev = o["path"]
					if o["security_model"] != "none" {
						t.Errorf("%q: -fsdev %q parses to %v", dir, args[i+1], o)
					}
				}
			case "-append":
				appendLine = args[i+1]
			}
		}
		if fsdev != dir {
			t.Errorf("%q: QEMU would share %q (args %q)", dir, fsdev, args)
		}
		if strings.Contains(appendLine, dir) {
			t.Errorf("%q: on the kernel command line %q", dir, appendLine)
		}
	}
}

// The script must hand values through to the guest unchanged, however
// they are quoted.
func TestScriptQuoting(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	s := script(`printf '%s|%s' "$A" "$B"`, []string{"A=it's $HOME", "B=a=b c"})
	out, err := exec.Command(sh, "-c", s).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), "it's $HOME|a=b c"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestRunRefusesBadResultsDir(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "qemu")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Kernel: fake, Initrd: fake, QEMU: fake, KVM: "off"}
	for _, rd := range []string{"", "relative", filepath.Join(dir, "missing")} {
		cfg.ResultsDir = rd
		if _, err := Run(context.Background(), cfg, "true"); err == nil || errors.Is(err, ErrUnavailable) && os.Geteuid() == 0 {
			t.Errorf("results dir %q: err = %v, want a refusal", rd, err)
		}
	}
}

// A VM that powers off without running the command is an error, not a
// success with status 0.
func TestRunWithoutExitStatus(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("Run needs root")
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "qemu")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho booted\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	results := filepath.Join(dir, "results")
	if err := os.Mkdir(results, 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), Config{Kernel: fake, Initrd: fake, QEMU: fake, KVM: "off", ResultsDir: results}, "true")
	if err == nil || !strings.Contains(err.Error(), "without finishing") {
		t.Fatalf("err = %v, want 'without finishing'", err)
	}
	if !strings.Contains(string(res.Output), "booted") {
		t.Errorf("output %q lacks the console text", res.Output)
	}
}

// Issue 25: a checkout under /tmp (the guest mounts its own /tmp) and a
// path with a space and a comma. The results directory is under /tmp
// itself, not under $TMPDIR.
func TestRunResultsUnderTmpWithSpaceAndComma(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("Run needs root")
	}
	results, err := os.MkdirTemp("/tmp", "rds csi,vm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(results) })
	cfg := fakeQEMUConfig(t, "boot")
	cfg.KVM = "off"
	cfg.ResultsDir = results
	t.Setenv("FAKE_QEMU_EXIT", "7")
	res, err := Run(context.Background(), cfg, "exit 7")
	if err != nil {
		t.Fatalf("results dir %q: %v\n%s", results, err, res.Output)
	}
	if res.ExitStatus != 7 {
		t.Errorf("exit status %d, want the guest's 7; console:\n%s", res.ExitStatus, res.Output)
	}
}

// Issue 25: a /dev/kvm that opens but whose QEMU aborts ("failed to set
// MSR"): "auto" must run the guest under TCG, not fail. This one needs the
// machine's /dev/kvm to open (the decision logic without it: probe_test.go).
func TestRunAutoWithKVMThatAborts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("Run needs root")
	}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		t.Skipf("/dev/kvm: %v", err)
	} else {
		f.Close()
	}
	cfg := fakeQEMUConfig(t, "abort")
	t.Setenv("RDS_CSI_VM_KVM", "")
	cfg.KVM = "auto"
	cfg.ResultsDir = t.TempDir()
	res, err := Run(context.Background(), cfg, "true")
	if err != nil {
		t.Fatalf("%v\n%s", err, res.Output)
	}
	if res.ExitStatus != 0 || res.KVM {
		t.Errorf("exit status %d, kvm %v; want 0 under TCG; console:\n%s", res.ExitStatus, res.KVM, res.Output)
	}
}
