package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// -h is a request, not an error: the usage and exit status 0 (a flag
// error stays 2).
func TestHelpExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "rds-sim")
	if out, err := exec.Command(goTool(t), "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"-h"}, 0, "Usage of rds-sim"},
		{[]string{"--help"}, 0, "Usage of rds-sim"},
		{[]string{"--no-such-flag"}, 2, "flag provided but not defined"},
	} {
		out, err := exec.Command(bin, tc.args...).CombinedOutput()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != tc.code || !strings.Contains(string(out), tc.says) {
			t.Errorf("rds-sim %v: exit %d, want %d; output %q lacks %q", tc.args, code, tc.code, out, tc.says)
		}
	}
}
