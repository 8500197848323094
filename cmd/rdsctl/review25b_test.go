//go:build review25b

package main

import (
	"strings"
	"testing"
)

// HOLE (wrong exit status: a script cannot tell a typo from an RDS failure;
// the message lacks the usage hint): usage errors that rdsctl reports as a
// failed command (exit 1) although its usage says "2 a usage error (bad flag
// or argument; nothing done)". Inputs:
//
//	rdsctl -key K -known-hosts KH selftest -o yaml   -> exit 1 `-o "yaml": want text or json`
//	rdsctl -key K -known-hosts KH copy s1 s1         -> exit 1 `invalid argument: copy of "s1" onto itself`
//
// Both should exit 2, name the flag or argument and send nothing to the RDS.
func TestReview25bUsageErrorsExitTwo(t *testing.T) {
	flags, _, _ := simWithKey(t)
	for _, args := range [][]string{{"selftest", "-o", "yaml"}, {"copy", "s1", "s1"}} {
		code, out, errOut := rdsctlProcess(t, append(append([]string{"-show-commands"}, flags...), args...)...)
		if code != 2 || strings.Contains(out, "> ") || !strings.Contains(errOut, "rdsctl -h") {
			t.Errorf("rdsctl %q: exit %d, stdout %q, stderr %q; want a usage error (exit 2), nothing sent", args, code, out, errOut)
		}
	}
}

// HOLE (a flag silently ignored: the operator asked for JSON and gets the
// text table, or believes a list was "closed"/data-checked): -o, -closed,
// -data, -keep-connections, -copy-wait are accepted with any command and
// ignored by those that do not use them, unlike kubectl rds, which refuses a
// flag its command does not use. Input:
//
//	rdsctl -key K -known-hosts KH list -o json   -> exit 0, a text table
//
// It should be a usage error (exit 2) naming -o (only selftest uses it).
// Likewise a negative -copy-wait (rdsctl -copy-wait -1s selftest) is taken.
func TestReview25bFlagsACommandDoesNotUse(t *testing.T) {
	flags, _, _ := simWithKey(t)
	for _, args := range [][]string{{"list", "-o", "json"}, {"list", "-closed"}, {"probe", "-keep-connections"}, {"selftest", "-copy-wait", "-1s"}} {
		code, out, errOut := rdsctlProcess(t, append(append([]string{"-show-commands"}, flags...), args...)...)
		if code != 2 || strings.Contains(out, "> ") {
			t.Errorf("rdsctl %q: exit %d, stdout %.200q, stderr %.200q; want a usage error (exit 2) naming the flag, nothing sent", args, code, out, errOut)
		}
	}
}
