package framework

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// hack/controlplane.sh's READY_TIMEOUT went into shell arithmetic
// unchecked: a name read as 0 seconds (every start timed out at once,
// "timed out after abcs"), a negative number likewise, and an expression
// was evaluated. Anything but whole seconds is refused (exit 2, naming
// it) before the script creates or starts anything.
func TestControlPlaneScriptRefusesAnUnreadableReadyTimeout(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "hack", "controlplane.sh")
	for _, v := range []string{"abc", "-5", "0", "1+1", "a[0]", "1.5", "", "9999999"} {
		dir := filepath.Join(t.TempDir(), "cp")
		cmd := exec.Command("bash", script, "status", dir)
		cmd.Env = append(os.Environ(), "READY_TIMEOUT="+v)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if v == "" {
			// Empty is unset: the default, 120.
			if strings.Contains(string(out), "READY_TIMEOUT") {
				t.Errorf("READY_TIMEOUT empty: %s; want the default", out)
			}
			continue
		}
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "READY_TIMEOUT="+v+": want whole seconds") {
			t.Errorf("READY_TIMEOUT=%q: %v, %s; want exit 2 naming it", v, err, out)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("READY_TIMEOUT=%q: %s was created before the refusal", v, dir)
		}
	}
}
