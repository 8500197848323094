//go:build nvmevm

package nvme

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// AuthUnsupported on a real kernel: the one the VM boots, whose package
// config e2e/nvme reads (hack/nvme-vm.sh prints KERNEL_NVME_AUTH). On
// Debian's 6.12 (CONFIG_NVME_HOST_AUTH=y) it must report support; on 6.1
// (NVME_VM_KERNEL_PACKAGE=linux-image-6.1.0-56-amd64; no CONFIG_NVME_AUTH)
// it must refuse, for the reason the code gives for that kernel's
// version: 6.0 to 6.6 list dhchap_secret among /dev/nvme-fabrics' options
// whatever the config, and only the missing nvme_common held by nvme_core
// tells; 6.7+ list the option only with host authentication.
func TestVMAuthUnsupportedMatchesKernel(t *testing.T) {
	requireVM(t)
	want := os.Getenv("RDS_NVME_VM_KERNEL_NVME_AUTH")
	if want != "0" && want != "1" {
		t.Fatal("RDS_NVME_VM_KERNEL_NVME_AUTH is not set (e2e/nvme sets it from hack/nvme-vm.sh prepare)")
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	options, err := os.ReadFile("/dev/nvme-fabrics")
	if err != nil {
		t.Fatal(err)
	}
	listed := strings.Contains(string(options), "dhchap_secret=")
	_, authMod := os.Stat("/sys/module/nvme_auth")
	_, commonMod := os.Stat("/sys/module/nvme_common/holders/nvme_core")
	why := vmConnector(t).AuthUnsupported()
	t.Logf("kernel %s: dhchap_secret listed %v, nvme_auth loaded %v, nvme_common held by nvme_core %v; AuthUnsupported = %q",
		release, listed, authMod == nil, commonMod == nil, why)
	if want == "1" {
		if why != "" {
			t.Fatalf("the kernel package has NVMe host authentication, and AuthUnsupported says %q", why)
		}
		return
	}
	if why == "" {
		t.Fatal("the kernel package has no NVMe host authentication, and AuthUnsupported reports it supported")
	}
	major, minor := kernelVersion(t, release)
	switch {
	case major == 6 && minor < 7:
		if !listed || !strings.Contains(why, "neither nvme_auth nor nvme_common") {
			t.Fatalf("on %s the option should be listed (it is: %v) and the module missing; AuthUnsupported = %q", release, listed, why)
		}
	case major > 6 || major == 6 && minor >= 7:
		if listed || !strings.Contains(why, "does not accept dhchap_secret") {
			t.Fatalf("on %s without host authentication the option should not be listed (listed: %v); AuthUnsupported = %q", release, listed, why)
		}
	}
}

func kernelVersion(t *testing.T, release string) (major, minor int) {
	t.Helper()
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		t.Fatalf("kernel release %q", release)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimLeftFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		t.Fatalf("kernel release %q", release)
	}
	return major, minor
}
