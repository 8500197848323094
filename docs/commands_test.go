//go:build !e2e

package docs

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// portPattern finds the documented port where a command names it (an
// address, -p, --port, --rds-port), never inside other numbers or names.
var portPattern = regexp.MustCompile(`(:|-p |--port[ =]|--rds-port[ =])` + documentedPort + `\b`)

// TestDocumentedCommands runs every block marked run, checks the flags
// of every block it does not run, and logs how many blocks each test runs
// and why the others are skipped.
func TestDocumentedCommands(t *testing.T) {
	root := repoRoot(t)
	bin := buildBinaries(t, root)
	blocks := allBlocks(t, root)
	scripts := map[string][]string{}
	var docs []string
	for _, b := range blocks {
		if k, _ := b.kind(); k != markRun {
			for _, problem := range unknownFlags(t, bin, b.text) {
				t.Errorf("%s: %s", b, problem)
			}
			continue
		}
		if len(scripts[b.doc]) == 0 {
			docs = append(docs, b.doc)
		}
		scripts[b.doc] = append(scripts[b.doc], fmt.Sprintf("# %s\n%s", b, b.text))
	}
	for _, doc := range docs {
		t.Run(doc, func(t *testing.T) { runDocumented(t, root, bin, strings.Join(scripts[doc], "\n")) })
	}
	t.Log(census(blocks))
}

// runDocumented runs a document's run blocks as one bash script in a
// scratch directory and kills whatever it left running.
func runDocumented(t *testing.T, root, bin, script string) {
	needSSH(t, script)
	work := scratch(t, bin)
	script = portPattern.ReplaceAllString(script, "${1}"+freePort(t))
	if strings.Contains(script, documentedPort) {
		t.Fatalf("the commands name port %s in a form this test does not replace (an address, -p, --port, --rds-port):\n%s", documentedPort, script)
	}
	out, err, _ := runScript(t, work, script, 3*time.Minute)
	if err != nil {
		t.Fatalf("the documented commands failed: %v\nscript:\n%s\noutput:\n%s", err, script, out)
	}
	t.Logf("output:\n%s", out)
	// Run from a checkout, as the docs say, they leave these files in it.
	entries, err := os.ReadDir(work)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() {
			name += "/" // git tells a directory by the slash when it is not there
		}
		if name != "bin" && name != "home/" && !gitIgnored(t, root, name) {
			t.Errorf("the documented commands create %s in the checkout, and git does not ignore it", name)
		}
	}
}

// The files the docs tell a user to generate next to the example overlay
// (the driver's key pair, the pinned host key) are git-ignored.
func TestGeneratedKeysAreIgnored(t *testing.T) {
	root := repoRoot(t)
	for _, f := range []string{"id_ed25519", "id_ed25519.pub", "known_hosts"} {
		path := filepath.Join("manifests", "overlays", "example", f)
		if !gitIgnored(t, root, path) {
			t.Errorf("%s is not git-ignored (docs/deploy.md has users generate it there)", path)
		}
	}
}

// simulatorScript is docs/simulator.md's run blocks, joined as
// TestDocumentedCommands joins them, with the documented port replaced by
// port.
func simulatorScript(t *testing.T, root, port string) string {
	t.Helper()
	blocks, err := shellBlocks(filepath.Join(root, "docs", "simulator.md"))
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, b := range blocks {
		if b.marker == "run" {
			parts = append(parts, b.text)
		}
	}
	if len(parts) == 0 {
		t.Fatal("docs/simulator.md has no run block")
	}
	return portPattern.ReplaceAllString(strings.Join(parts, "\n"), "${1}"+port)
}

// The simulator example works when tried again from the same
// checkout, as a user who tries it twice does: the key pair, the pool, the
// known_hosts file and the simulator's log of the first run are there.
// (gen-key never overwrites, and a first log's "listening on" must not
// pass for the second simulator being up.)
func TestSimulatorExampleRunsTwiceInOneCheckout(t *testing.T) {
	root := repoRoot(t)
	script := simulatorScript(t, root, documentedPort)
	needSSH(t, script)
	work := scratch(t, buildBinaries(t, root))
	for i := 1; i <= 2; i++ {
		out, err, hung := runScript(t, work, simulatorScript(t, root, freePort(t)), 2*time.Minute)
		if err != nil || hung {
			t.Fatalf("run %d of docs/simulator.md's example in one checkout: %v (hung: %v)\n%s", i, err, hung, out)
		}
	}
}

// When the simulator cannot start (the documented port taken, say by the
// simulator of an earlier try), the simulator example stops with the
// simulator's reason instead of waiting for ever for "listening on". The
// port is held by a listener; a hang is bounded at a minute.
func TestSimulatorExampleFailsClearlyWhenThePortIsTaken(t *testing.T) {
	root := repoRoot(t)
	needSSH(t, simulatorScript(t, root, documentedPort))
	work := scratch(t, buildBinaries(t, root))
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	out, err, hung := runScript(t, work, simulatorScript(t, root, port), time.Minute)
	switch {
	case hung:
		t.Fatalf("with port %s taken docs/simulator.md's example still waits for 'listening on' after a minute; output:\n%s", port, out)
	case err == nil:
		t.Fatalf("with port %s taken docs/simulator.md's example succeeded:\n%s", port, out)
	case !strings.Contains(out, "address already in use"):
		t.Errorf("with port %s taken docs/simulator.md's example failed without saying why (the simulator's log):\n%s", port, out)
	}
}
