package vm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// ChooseAccel's decision for each mode and each kind of KVM, with a fake
// QEMU and a fake /dev/kvm (a file that opens, or none). The hanging KVM
// gets a 1 s probe deadline: it never boots, so the outcome does not
// depend on the machine's speed; the others get a minute.
func TestChooseAccel(t *testing.T) {
	tests := []struct {
		name      string
		mode      string // Config.KVM
		env       string // RDS_CSI_VM_KVM
		kvm       string // FAKE_QEMU_KVM
		noDevice  bool
		wantKVM   bool
		wantErr   bool
		reason    string
		wantStart []string // QEMU starts, in order
	}{
		{name: "auto, KVM boots", mode: "auto", kvm: "boot", wantKVM: true, reason: "reached /init under KVM", wantStart: []string{"kvm-probe"}},
		{name: "auto, QEMU aborts (MSR)", mode: "auto", kvm: "abort", reason: "failed to set MSR", wantStart: []string{"kvm-probe"}},
		{name: "auto, guest hangs after the firmware", mode: "auto", kvm: "hang", reason: "no guest /init within 1s", wantStart: []string{"kvm-probe"}},
		{name: "auto, no /dev/kvm", mode: "auto", kvm: "boot", noDevice: true, reason: "/dev/kvm cannot be opened"},
		{name: "default is auto", kvm: "abort", reason: "KVM probe failed", wantStart: []string{"kvm-probe"}},
		{name: "env off", env: "off", kvm: "boot", reason: KVMEnv + "=off"},
		{name: "env on: not probed", env: "on", kvm: "hang", wantKVM: true, reason: "not probed"},
		{name: "config wins over env", mode: "off", env: "on", kvm: "boot", reason: "=off"},
		{name: "on without /dev/kvm", mode: "on", kvm: "boot", noDevice: true, wantErr: true},
		{name: "bad value", env: "yes", kvm: "boot", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := fakeQEMUConfig(t, tt.kvm)
			t.Setenv(KVMEnv, tt.env)
			cfg.KVM = tt.mode
			cfg.kvmDevice = filepath.Join(t.TempDir(), "kvm")
			if !tt.noDevice {
				if err := os.WriteFile(cfg.kvmDevice, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cfg.ProbeTimeout = time.Minute
			if tt.kvm == "hang" {
				cfg.ProbeTimeout = time.Second
			}
			got, err := ChooseAccel(context.Background(), cfg)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("got %v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.KVM != tt.wantKVM || !strings.Contains(got.Reason, tt.reason) {
				t.Errorf("got %s, want kvm=%v with a reason naming %q", got, tt.wantKVM, tt.reason)
			}
			if starts := fakeStarts(t); !reflect.DeepEqual(starts, tt.wantStart) {
				t.Errorf("QEMU starts %q, want %q", starts, tt.wantStart)
			}
		})
	}
}

// The probe decides, once; a run that fails afterwards is reported, never
// run again under TCG (that would turn a real failure into a retry).
func TestRunNoRetryAfterProbe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("Run needs root")
	}
	tests := []struct {
		name       string
		kvm        string
		exit       string // the guest command's status
		wantStatus int
		wantErr    string
		wantStarts []string
	}{
		{name: "command fails under KVM", kvm: "boot", exit: "1", wantStatus: 1, wantStarts: []string{"kvm-probe", "kvm"}},
		{name: "KVM run crashes after a good probe", kvm: "probe-only", wantErr: "hardware error", wantStarts: []string{"kvm-probe", "kvm"}},
		{name: "command fails under the TCG fallback", kvm: "abort", exit: "1", wantStatus: 1, wantStarts: []string{"kvm-probe", "tcg"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := fakeQEMUConfig(t, tt.kvm)
			t.Setenv("FAKE_QEMU_EXIT", tt.exit)
			cfg.KVM = "auto"
			cfg.kvmDevice = filepath.Join(t.TempDir(), "kvm")
			if err := os.WriteFile(cfg.kvmDevice, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			cfg.ResultsDir = t.TempDir()
			var logged []string
			cfg.Logf = func(format string, args ...any) { logged = append(logged, format) }
			res, err := Run(context.Background(), cfg, "exit "+tt.exit)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(string(res.Output), tt.wantErr) {
					t.Errorf("err %v, output %q; want an error with %q in the output", err, res.Output, tt.wantErr)
				}
			} else if err != nil || res.ExitStatus != tt.wantStatus {
				t.Errorf("status %d, err %v; want status %d", res.ExitStatus, err, tt.wantStatus)
			}
			if starts := fakeStarts(t); !reflect.DeepEqual(starts, tt.wantStarts) {
				t.Errorf("QEMU starts %q, want %q", starts, tt.wantStarts)
			}
			if len(logged) != 1 {
				t.Errorf("logged %q, want the accelerator once", logged)
			}
		})
	}
}

// A guest that never reaches /init (KVM forced on a KVM that cannot run
// it) is killed at InitTimeout with an error that says so, instead of
// hanging until the caller's deadline.
func TestRunInitDeadline(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("Run needs root")
	}
	cfg := fakeQEMUConfig(t, "hang")
	cfg.KVM = "on"
	cfg.kvmDevice = filepath.Join(t.TempDir(), "kvm")
	if err := os.WriteFile(cfg.kvmDevice, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.ResultsDir = t.TempDir()
	cfg.InitTimeout = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, err := Run(ctx, cfg, "true")
	if err == nil || !strings.Contains(err.Error(), "did not reach /init") || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want 'did not reach /init'", err)
	}
}

// HostDirs under /tmp are listed for /init relative to /tmp, whatever their
// characters; the rest need nothing; the guest's own trees are refused.
func TestTmpBinds(t *testing.T) {
	tests := []struct {
		dirs    []string
		want    []string
		wantErr bool
	}{
		{dirs: []string{"/tmp/rds csi,x/rds-csi/.cache/nvme-vm", "/root/src/github.com/srvlab/rds-csi", "/tmpfoo/x"}, want: []string{"rds csi,x/rds-csi/.cache/nvme-vm"}},
		{dirs: []string{"/run/user/0/rds-csi"}, wantErr: true},
		{dirs: []string{"/dev/shm/rds-csi"}, wantErr: true},
		{dirs: []string{"/tmp"}, wantErr: true},
		{dirs: []string{"/tmp/a\nb"}, wantErr: true},
		{dirs: nil},
	}
	for _, tt := range tests {
		got, err := tmpBinds(tt.dirs)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("tmpBinds(%q) = %q, %v; want %q, error %v", tt.dirs, got, err, tt.want, tt.wantErr)
		}
	}
}

// Run hands /init the list in the results directory, and refuses a
// directory the guest cannot be shown before starting anything.
func TestRunHostDirs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("Run needs root")
	}
	checkout, err := os.MkdirTemp("/tmp", "rds csi,checkout-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(checkout) })
	cfg := fakeQEMUConfig(t, "boot")
	cfg.KVM = "off"
	cfg.ResultsDir = t.TempDir()
	cfg.HostDirs = []string{checkout}
	if _, err := Run(context.Background(), cfg, "true"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(cfg.ResultsDir, tmpBindsFile))
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimPrefix(checkout, "/tmp/") + "\n"; string(b) != want {
		t.Errorf("%s = %q, want %q", tmpBindsFile, b, want)
	}
	cfg.HostDirs = []string{"/run/rds-csi"}
	if _, err := Run(context.Background(), cfg, "true"); err == nil || !strings.Contains(err.Error(), "cannot see it") {
		t.Errorf("a checkout under /run: err = %v, want a refusal", err)
	}
	if starts := fakeStarts(t); len(starts) != 1 {
		t.Errorf("QEMU starts %q, want only the first run's", starts)
	}
}
