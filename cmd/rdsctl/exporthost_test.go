package main

import (
	"bytes"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// closedRDS is a command-line prefix for an RDS that refuses every
// connection: a command that validated its arguments never gets as far
// as dialling it.
func closedRDS(t *testing.T) []string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	key := filepath.Join(t.TempDir(), "id_ed25519")
	if _, err := rdssim.WriteClientKey(key, ""); err != nil {
		t.Fatal(err)
	}
	return []string{"-address", "127.0.0.1", "-port", strconv.Itoa(port), "-key", key, "-insecure-skip-host-key-check", "-timeout", "5s"}
}

// Fixed HOLE (issue 25 review): `rdsctl export SLOT on ""` (an empty HOSTNQN, as from an unset
// shell variable: export pvc-1 on "$NQN") is taken for "any": the export
// is opened to every host, undoing storage fencing, when the usage text
// says the word any is how to ask for that. It reaches RouterOS instead of
// being a usage error (exit 2).
func TestReview25ExportOnEmptyHost(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := cli(append(closedRDS(t), "export", "pvc-1", "on", ""), &stdout, &stderr)
	if code != 2 || strings.Contains(stderr.String(), "dial") {
		t.Errorf("export on \"\": exit %d, stderr %q: want a usage error before any RouterOS command (an empty HOSTNQN opens the export to any host)", code, stderr.String())
	}
}

// Fixed HOLE (issue 25 review): `rdsctl export SLOT off NOTANNQN` is not validated: it dials the
// RDS and runs /disk print before the NQN is looked at, so with the RDS
// reachable the operator learns about the typo only after a round trip,
// and with it unreachable gets a transport error that does not name the
// bad argument (`export on NOTANNQN` does name it).
func TestReview25ExportOffBadHostValidatedFirst(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := cli(append(closedRDS(t), "export", "pvc-1", "off", "notnqn"), &stdout, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), `"notnqn"`) || strings.Contains(stderr.String(), "dial") {
		t.Errorf("export off notnqn: exit %d, stderr %q: want an error naming the NQN, before dialling", code, stderr.String())
	}
}
