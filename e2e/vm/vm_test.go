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
		for _, w := range []string{tt.want, "rdsvm.results=/r nvme_core.multipath=N", "path=/,security_model=none,readonly=on", "path=/r,security_model=none", "-m 2048"} {
			if !strings.Contains(got, w) {
				t.Errorf("kvm=%v: args %q lack %q", tt.kvm, got, w)
			}
		}
		if strings.Contains(got, tt.not) {
			t.Errorf("kvm=%v: args %q contain %q", tt.kvm, got, tt.not)
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
	for _, rd := range []string{"", "relative", "/tmp/x", "/a b"} {
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
	// Run refuses a results directory under /tmp (the guest mounts its
	// own /tmp); this one is next to the test unless the checkout itself
	// is under /tmp.
	parent, _ := filepath.Abs(".")
	if strings.HasPrefix(parent+"/", "/tmp/") {
		parent = "/var/tmp"
	}
	results, err := os.MkdirTemp(parent, "rds-csi-vm-results-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(results) })
	abs, _ := filepath.Abs(results)
	res, err := Run(context.Background(), Config{Kernel: fake, Initrd: fake, QEMU: fake, KVM: "off", ResultsDir: abs}, "true")
	if err == nil || !strings.Contains(err.Error(), "without finishing") {
		t.Fatalf("err = %v, want 'without finishing'", err)
	}
	if !strings.Contains(string(res.Output), "booted") {
		t.Errorf("output %q lacks the console text", res.Output)
	}
}
