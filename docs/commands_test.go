// Package docs holds the user documentation. Its test runs the commands
// the documentation shows, so that they cannot drift from the binaries.
//
// The marker convention: every shell block (```sh, ```bash) of README.md
// and docs/*.md is preceded by an HTML comment on the line before it,
//
//	<!-- docs-test: run -->            run as written, in order, in one shell per file
//	<!-- docs-test: skip: <reason> --> not run (a real RDS, a cluster, root, minutes)
//
// An unmarked shell block fails the test. Run blocks execute with bash
// -euo pipefail in a scratch directory holding bin/ (the binaries built
// from this checkout, as `make build` leaves them) and a HOME of their
// own, as a new user would run them from the repository; the one change
// is the documented simulator port 2222, replaced with a free port so the
// test cannot collide with anything listening there. In skipped blocks,
// every flag given to one of this repository's binaries must exist.
package docs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// documentedPort is the simulator's port in the examples.
const documentedPort = "2222"

// block is one shell block of a document.
type block struct {
	line   int    // of the opening fence
	marker string // "run", "skip: <reason>", or "" (none)
	text   string
}

var markerPattern = regexp.MustCompile(`^<!--\s*docs-test:\s*(.*?)\s*-->$`)

// shellBlocks returns the shell blocks of a markdown file with their markers.
func shellBlocks(path string) ([]block, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		blocks  []block
		cur     *block // the shell block being read
		inOther bool   // inside another fenced block
		prev    string // the line before, trimmed
		lineNo  int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		switch {
		case cur != nil && line == "```":
			blocks, cur = append(blocks, *cur), nil
		case cur != nil:
			cur.text += sc.Text() + "\n"
		case inOther:
			inOther = line != "```"
		case strings.HasPrefix(line, "```"):
			switch strings.TrimPrefix(line, "```") {
			case "sh", "bash", "shell":
				cur = &block{line: lineNo}
				if m := markerPattern.FindStringSubmatch(prev); m != nil {
					cur.marker = m[1]
				}
			default:
				inOther = true
			}
		}
		prev = line
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: unterminated code block", path, cur.line)
	}
	return blocks, sc.Err()
}

func repoRoot(t *testing.T) string {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", root, err)
	}
	return root
}

func documents(t *testing.T, root string) []string {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join(root, "README.md")}, docs...)
}

// binaries is the bin/ directory the tests of this package share, built
// once (TestMain removes it).
var binaries struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	os.Exit(code)
}

// buildBinaries builds the repository's commands once, as `make build`
// does into bin/, and returns their directory.
func buildBinaries(t *testing.T, root string) string {
	t.Helper()
	binaries.once.Do(func() {
		tmp, err := os.MkdirTemp("", "rds-csi-docs-bin-")
		if err != nil {
			binaries.err = err
			return
		}
		binaries.dir = tmp
		cmd := exec.Command("go", "build", "-o", tmp+string(filepath.Separator), "./cmd/...")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binaries.err = fmt.Errorf("go build ./cmd/...: %w\n%s", err, out)
		}
	})
	if binaries.err != nil {
		t.Fatal(binaries.err)
	}
	return binaries.dir
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// portPattern finds the documented port where a command names it (an
// address, -p, --port, --rds-port), never inside other numbers or names.
var portPattern = regexp.MustCompile(`(:|-p |--port[ =]|--rds-port[ =])` + documentedPort + `\b`)

// TestDocumentedCommands runs every block marked run and checks the flags
// of every block marked skip.
func TestDocumentedCommands(t *testing.T) {
	root := repoRoot(t)
	bin := buildBinaries(t, root)
	for _, doc := range documents(t, root) {
		rel, _ := filepath.Rel(root, doc)
		blocks, err := shellBlocks(doc)
		if err != nil {
			t.Fatal(err)
		}
		var script []string
		for _, b := range blocks {
			switch {
			case b.marker == "run":
				script = append(script, fmt.Sprintf("# %s:%d\n%s", rel, b.line, b.text))
			case strings.HasPrefix(b.marker, "skip:") && strings.TrimSpace(strings.TrimPrefix(b.marker, "skip:")) != "":
				for _, problem := range unknownFlags(t, bin, b.text) {
					t.Errorf("%s:%d: %s", rel, b.line, problem)
				}
			default:
				t.Errorf("%s:%d: shell block without a valid marker (%q): put <!-- docs-test: run --> or <!-- docs-test: skip: <why> --> on the line before it", rel, b.line, b.marker)
			}
		}
		if len(script) > 0 {
			t.Run(rel, func(t *testing.T) { runDocumented(t, root, bin, strings.Join(script, "\n")) })
		}
	}
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

// needSSH skips (or, in CI, fails) a test whose commands use the ssh
// client when it is not installed.
func needSSH(t *testing.T, script string) {
	t.Helper()
	if _, err := exec.LookPath("ssh"); err != nil && strings.Contains(script, "ssh ") {
		if os.Getenv("CI") == "true" {
			t.Fatal("the documented commands use the ssh client, which is not installed")
		}
		t.Skip("the documented commands use the ssh client, which is not installed (apt-get install openssh-client)")
	}
}

// scratch makes a directory as a checkout looks to the documented
// commands: bin/ with the binaries, and a HOME of its own (home/).
func scratch(t *testing.T, bin string) string {
	t.Helper()
	work := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(work, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(work, "home"), 0o700); err != nil {
		t.Fatal(err)
	}
	return work
}

// runScript runs script with bash -euo pipefail in dir, HOME dir/home, and
// then kills its whole process group (a simulator started with & outlives
// bash); after limit it kills it early and reports hung: a hang is a
// failure some tests look for, bounded instead of blocking the run.
func runScript(t *testing.T, dir, script string, limit time.Duration) (out string, err error, hung bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+filepath.Join(dir, "home"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	killGroup := func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Cancel = killGroup
	var b strings.Builder
	cmd.Stdout, cmd.Stderr = &b, &b
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if kerr := killGroup(); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
		t.Logf("stopping what the commands left running: %v", kerr)
	}
	return b.String(), err, ctx.Err() != nil
}

// gitIgnored reports whether path (relative to root) is git-ignored; it
// skips the test outside a git checkout.
func gitIgnored(t *testing.T, root, path string) bool {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	if err := exec.Command("git", "-C", root, "rev-parse", "--git-dir").Run(); err != nil {
		t.Skip("not a git checkout")
	}
	return exec.Command("git", "-C", root, "check-ignore", "-q", "--no-index", path).Run() == nil
}

// toolPattern finds an invocation of one of the repository's binaries.
var toolPattern = regexp.MustCompile(`(?:^|\s)(bin/(rdsctl|rds-sim|rds-csi-driver|kubectl-rds)|kubectl rds)(\s|$)`)

// unknownFlags returns the flags given to the repository's binaries in a
// block that their -h does not list.
func unknownFlags(t *testing.T, bin, text string) []string {
	var problems []string
	text = strings.ReplaceAll(text, "\\\n", " ")
	for _, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		m := toolPattern.FindStringSubmatchIndex(line)
		if m == nil {
			continue
		}
		tool := line[m[2]:m[3]]
		name := strings.TrimPrefix(tool, "bin/")
		if tool == "kubectl rds" {
			name = "kubectl-rds"
		}
		help := toolHelp(t, filepath.Join(bin, name))
		for _, tok := range strings.Fields(line[m[3]:]) {
			if !strings.HasPrefix(tok, "-") || tok == "-" || tok == "--" {
				continue
			}
			flagName, _, _ := strings.Cut(strings.TrimLeft(tok, "-"), "=")
			if flagName == "h" || flagName == "help" {
				continue // every tool's help
			}
			if !regexp.MustCompile(`(^|[\s,])--?` + regexp.QuoteMeta(flagName) + `\b`).MatchString(help) {
				problems = append(problems, fmt.Sprintf("%s has no flag %s (%s -h)", name, tok, name))
			}
		}
	}
	return problems
}

var helpCache = map[string]string{}

func toolHelp(t *testing.T, path string) string {
	if h, ok := helpCache[path]; ok {
		return h
	}
	// The exit status of -h differs between the tools; the text is what counts.
	out, _ := exec.Command(path, "-h").CombinedOutput()
	if len(out) == 0 {
		t.Fatalf("%s -h printed nothing", path)
	}
	helpCache[path] = string(out)
	return string(out)
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
