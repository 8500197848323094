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

// `rdsctl export SLOT on ""` (an empty HOSTNQN, as from an unset shell
// variable: export pvc-1 on "$NQN") is a usage error (exit 2) before any
// RouterOS command, not "any": the usage text says the word any is how to
// ask for an export open to every host, and taking "" for it would undo
// storage fencing.
func TestExportOnAnEmptyHostIsAUsageError(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := cli(append(closedRDS(t), "export", "pvc-1", "on", ""), &stdout, &stderr)
	if code != 2 || strings.Contains(stderr.String(), "dial") {
		t.Errorf("export on \"\": exit %d, stderr %q: want a usage error before any RouterOS command (an empty HOSTNQN opens the export to any host)", code, stderr.String())
	}
}

// `rdsctl export SLOT off NOTANNQN` names the bad NQN before it dials the
// RDS, as `export on NOTANNQN` does: looked at only after /disk print,
// the typo would show after a round trip with the RDS reachable, and
// behind a transport error that does not name it with the RDS
// unreachable.
func TestExportOffValidatesTheHostBeforeDialling(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := cli(append(closedRDS(t), "export", "pvc-1", "off", "notnqn"), &stdout, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), `"notnqn"`) || strings.Contains(stderr.String(), "dial") {
		t.Errorf("export off notnqn: exit %d, stderr %q: want an error naming the NQN, before dialling", code, stderr.String())
	}
}
