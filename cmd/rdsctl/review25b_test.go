//go:build review25b

package main

import (
	"os"
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

// HOLE (misleading message: the operator gave the .pub that gen-key wrote
// beside the key and is told "no key found"): -key naming a public key file.
// Input: rdsctl gen-key k; chmod 400 k.pub; rdsctl -key k.pub -known-hosts KH probe
// -> exit 2 "SSH key k.pub: ssh: no key found". It should say that k.pub is a
// public key and -key wants the private key (k). The driver's --rds-key-file
// says the same ("RDS client: invalid argument: SSH key k.pub: ssh: no key found").
func TestReview25bPublicKeyNamedAsSuch(t *testing.T) {
	dir := t.TempDir()
	key := dir + "/k"
	if code, _, errOut := rdsctlProcess(t, "gen-key", key); code != 0 {
		t.Fatalf("gen-key: exit %d: %s", code, errOut)
	}
	if err := os.Chmod(key+".pub", 0o400); err != nil {
		t.Fatal(err)
	}
	kh := dir + "/known_hosts"
	if err := os.WriteFile(kh, []byte("127.0.0.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := rdsctlProcess(t, "-key", key+".pub", "-known-hosts", kh, "probe")
	if code != 2 || !strings.Contains(strings.ToLower(errOut), "public key") {
		t.Errorf("-key k.pub: exit %d, stderr %q; want exit 2 saying it is a public key (give the private key)", code, errOut)
	}
}
