package nvme

import (
	"os"
	"os/exec"
	"testing"
)

// kubectl-rds is released for darwin (docs/release.md) and imports this
// package: it must compile off Linux, where the kernel's key errnos of
// NVMe authentication do not exist.
func TestPackageCompilesForDarwin(t *testing.T) {
	if testing.Short() {
		t.Skip("a cross build")
	}
	cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
	cmd.Env = append(os.Environ(), "GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GOOS=darwin go build ./pkg/nvme: %v\n%s", err, out)
	}
}
