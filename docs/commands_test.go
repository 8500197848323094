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
	perDoc := map[string][]docBlock{}
	var docs []string
	for _, b := range blocks {
		if k, _ := b.kind(); k != markRun {
			for _, problem := range unknownFlags(t, bin, b.text) {
				t.Errorf("%s: %s", b, problem)
			}
			continue
		}
		if len(perDoc[b.doc]) == 0 {
			docs = append(docs, b.doc)
		}
		perDoc[b.doc] = append(perDoc[b.doc], b)
	}
	ran := 0
	for _, doc := range docs {
		t.Run(doc, func(t *testing.T) { ran += runDocumented(t, root, bin, perDoc[doc]) })
	}
	t.Log(census(blocks))
	t.Logf("run blocks seen to run to their end: %d", ran)
}

// ranMarker is printed after each run block, so that the test sees each
// block ran to its end: a block that ends the script early (an exit 0, an
// exec, a here-document left open that swallows the rest) would otherwise
// pass with the blocks after it never run.
const ranMarker = "docs-test: ran "

// documentedScript joins a document's run blocks into one script, each
// followed by its ranMarker line.
func documentedScript(blocks []docBlock) string {
	var parts []string
	for _, b := range blocks {
		parts = append(parts, fmt.Sprintf("# %s\n%s\nprintf '\\n%%s\\n' %q", b, b.text, ranMarker+b.String()))
	}
	return strings.Join(parts, "\n")
}

// notRun lists the blocks whose ranMarker line out lacks.
func notRun(out string, blocks []docBlock) []string {
	lines := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		lines[l] = true
	}
	var missing []string
	for _, b := range blocks {
		if !lines[ranMarker+b.String()] {
			missing = append(missing, b.String())
		}
	}
	return missing
}

// runDocumented runs a document's run blocks as one bash script in a
// scratch directory, checks that each ran to its end, kills whatever it
// left running, and returns how many blocks ran.
func runDocumented(t *testing.T, root, bin string, blocks []docBlock) int {
	script := documentedScript(blocks)
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
	if missing := notRun(out, blocks); len(missing) > 0 {
		t.Fatalf("the script ended without running these blocks to their end: %v (an exit, an exec or a here-document left open in an earlier block?)\nscript:\n%s\noutput:\n%s", missing, script, out)
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
	return len(blocks)
}

// A run block that ends the script early is caught: before, the blocks
// after it were never run and the test passed. Here a here-document left
// open in the first block swallows the second (bash only warns, and exits
// 0), and an exit 0 in a block skips the next.
func TestDocumentedBlocksAreSeenToRun(t *testing.T) {
	for _, tc := range []struct {
		name  string
		texts []string
	}{
		{"a here-document left open", []string{"cat <<EOF\nhello\n", "echo second\n"}},
		{"an exit 0", []string{"echo first\nexit 0\n", "echo second\n"}},
	} {
		var blocks []docBlock
		for i, text := range tc.texts {
			blocks = append(blocks, docBlock{block: block{line: 10 * (i + 1), marker: markRun, text: text}, doc: "docs/example.md"})
		}
		out, err, hung := runScript(t, t.TempDir(), documentedScript(blocks), time.Minute)
		if err != nil || hung {
			t.Fatalf("%s: the script failed (%v, hung %v), so this is not the silent case:\n%s", tc.name, err, hung, out)
		}
		// Neither reached its end: the first ended the script (or never
		// ended), the second never ran.
		if got := notRun(out, blocks); strings.Join(got, " ") != "docs/example.md:10 docs/example.md:20" {
			t.Errorf("%s: blocks seen not to run to their end: %v, want [docs/example.md:10 docs/example.md:20]\n%s", tc.name, got, out)
		}
	}
	// And a script that runs each block through is seen to.
	blocks := []docBlock{{block: block{line: 1, marker: markRun, text: "echo one\n"}, doc: "d.md"}, {block: block{line: 5, marker: markRun, text: "echo two"}, doc: "d.md"}}
	if out, err, _ := runScript(t, t.TempDir(), documentedScript(blocks), time.Minute); err != nil || len(notRun(out, blocks)) != 0 {
		t.Errorf("two plain blocks: %v, not run %v\n%s", err, notRun(out, blocks), out)
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
