package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeAPTCache is an apt-cache that knows the packages in $FAKE_APT_KNOWN
// (one a line: a candidate) and lists $FAKE_APT_NAMES for pkgnames. Its
// policy answer goes on for a megabyte after the Candidate line, as a
// long version table does, so that a reader that stops at the match
// leaves it writing into a closed pipe.
const fakeAPTCache = `#!/bin/sh
case "$1" in
policy)
  if grep -qx -- "$2" "$FAKE_APT_KNOWN"; then
    printf '%s:\n  Installed: (none)\n  Candidate: 1.0-1\n  Version table:\n' "$2"
  else
    printf '%s:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n' "$2"
  fi
  head -c 1048576 /dev/zero | tr '\0' ' '
  echo
  ;;
pkgnames)
  grep -- "^$2" "$FAKE_APT_NAMES" || true
  ;;
depends)
  ;;
esac
`

// TestKernelPackageSelection: which kernel package hack/nvme-vm.sh boots.
// A pin apt has is taken as it is; one Debian removed (superseded in
// bookworm-security, or an old ABI after a point release) falls back to
// the newest of its series apt has, saying so; nothing of the series is
// a clear failure. The fake apt-cache's long policy answer catches a
// check that reads it through `grep -q` under pipefail (a known package
// taken for unknown).
func TestKernelPackageSelection(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not installed")
	}
	script, err := filepath.Abs("../../hack/nvme-vm.sh")
	if err != nil {
		t.Fatal(err)
	}
	const pin = "linux-image-6.12.117+deb12-amd64"
	names := []string{
		"linux-image-6.12.117+deb12-amd64", "linux-image-6.12.9+deb12-amd64",
		"linux-image-6.12.120+deb12-amd64", "linux-image-6.12.130+deb12-amd64",
		"linux-image-6.12.140+deb12-cloud-amd64", "linux-image-6.12.120+deb12-amd64-dbg",
		"linux-image-6.12-amd64", "linux-image-6.1.0-56-amd64", "linux-image-6.1.0-58-amd64",
	}
	tests := []struct {
		name     string
		override string   // NVME_VM_KERNEL_PACKAGE
		known    []string // packages apt has a candidate for
		cached   string   // a package already unpacked in the cache
		want     string   // "" for a failure
		say      string   // in stderr
	}{
		{name: "the pin apt has", known: []string{pin, "linux-image-6.12.130+deb12-amd64"}, want: pin},
		{name: "the pin superseded", known: []string{"linux-image-6.12.9+deb12-amd64", "linux-image-6.12.120+deb12-amd64", "linux-image-6.12.140+deb12-cloud-amd64", "linux-image-6.12.120+deb12-amd64-dbg"},
			want: "linux-image-6.12.120+deb12-amd64", say: "gone from apt"},
		{name: "the pin superseded, in the cache", known: []string{"linux-image-6.12.130+deb12-amd64"}, cached: pin, want: pin},
		{name: "the 6.1 pin superseded", override: "linux-image-6.1.0-56-amd64", known: []string{"linux-image-6.1.0-58-amd64", pin},
			want: "linux-image-6.1.0-58-amd64", say: "gone from apt"},
		{name: "nothing of the series", known: []string{"linux-image-6.1.0-58-amd64"}, say: "bookworm-security"},
		{name: "an override of another form is not replaced", override: "linux-image-custom", known: []string{pin}, say: "cannot find the kernel package linux-image-custom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "bin")
			cache := filepath.Join(dir, "cache")
			for _, d := range []string{bin, cache} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			write := func(p, s string, mode os.FileMode) {
				if err := os.WriteFile(p, []byte(s), mode); err != nil {
					t.Fatal(err)
				}
			}
			write(filepath.Join(bin, "apt-cache"), fakeAPTCache, 0o755)
			write(filepath.Join(bin, "apt-get"), "#!/bin/sh\nexit 0\n", 0o755)
			write(filepath.Join(dir, "known"), strings.Join(tt.known, "\n")+"\n", 0o644)
			write(filepath.Join(dir, "names"), strings.Join(names, "\n")+"\n", 0o644)
			if tt.cached != "" {
				if err := os.MkdirAll(filepath.Join(cache, tt.cached), 0o755); err != nil {
					t.Fatal(err)
				}
				write(filepath.Join(cache, tt.cached, ".unpacked"), "", 0o644)
			}
			cmd := exec.Command("bash", script, "kernel-package")
			cmd.Env = append(os.Environ(),
				"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
				"NVME_VM_CACHE="+cache,
				"NVME_VM_KERNEL_PACKAGE="+tt.override,
				"FAKE_APT_KNOWN="+filepath.Join(dir, "known"),
				"FAKE_APT_NAMES="+filepath.Join(dir, "names"),
			)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			got := strings.TrimSpace(string(out))
			if tt.want == "" {
				if err == nil {
					t.Fatalf("chose %q, want a failure", got)
				}
			} else if err != nil || got != tt.want {
				t.Fatalf("chose %q (err %v), want %q; stderr: %s", got, err, tt.want, stderr.String())
			}
			if tt.say != "" && !strings.Contains(stderr.String(), tt.say) {
				t.Errorf("stderr %q does not say %q", stderr.String(), tt.say)
			}
			if tt.say == "" && stderr.Len() > 0 {
				t.Errorf("unexpected stderr: %s", stderr.String())
			}
		})
	}
}
