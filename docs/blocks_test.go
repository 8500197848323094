// Package docs holds the user documentation. Its tests run the commands
// the documentation shows, so that they cannot drift from the binaries.
//
// The documents read are every markdown file of the repository
// (markdownFiles: README.md, CHANGELOG.md, docs/*.md, e2e/README.md,
// hack/README.md, ...; not hidden directories such as .cache, bin/, test
// artifacts or testdata). In them every fenced block (backticks or
// tildes) names its language: text for a diagram, a log or an output,
// yaml, json, and so on, a shell language for commands; a fence without
// one fails the test (fences_test.go), since what it holds would be
// neither run nor checked.
//
// The marker convention: every shell block (a fence whose language is
// sh, bash, shell, zsh, console or shell-session, in any case,
// attributes after it allowed) is preceded by an HTML comment on the line
// before it,
//
//	<!-- docs-test: run -->            run as written against the simulator
//	<!-- docs-test: cluster -->        run as written against a real kube-apiserver holding what the commands name
//	<!-- docs-test: install -->        run as written against a new, empty kube-apiserver of its own
//	<!-- docs-test: skip: <reason> --> not run (a real RDS, a cluster's nodes, minutes)
//
// An unmarked shell block fails the test. Run blocks execute in order, in
// one bash -euo pipefail per file, in a scratch directory holding bin/ (the
// binaries built from this checkout, as `make build` leaves them) and a
// HOME of their own, as a new user would run them from the repository; the
// one change is the documented simulator port 2222, replaced with a free
// port so the test cannot collide with anything listening there
// (commands_test.go, go test ./docs, part of make unit).
//
// Cluster and install blocks run, one bash each, under the e2e build tag
// (cluster_test.go, go test -tags e2e ./docs, part of make e2e): in a copy
// of the checkout, with kubectl and helm on PATH and KUBECONFIG naming the
// e2e control plane's admin. Cluster blocks share one control plane, on
// which the test first makes what they name (the driver and the
// simulator, nodes worker-1 and worker-2, pod web-0 in namespace shop, a
// PV whose claims annotation is unreadable); a placeholder such as <pv>
// becomes the name of the test's object. Install blocks each get a new
// control plane, as on a cluster nothing was installed on yet.
//
// In every block not run by a test, each flag given to one of this
// repository's binaries must exist (in a console transcript, on its
// command lines and in its output alike). Both tests log how many blocks were
// run and why the others were not.
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
	marker string // "run", "cluster", "install", "skip: <reason>", or "" (none)
	text   string
}

var markerPattern = regexp.MustCompile(`^<!--\s*docs-test:\s*(.*?)\s*-->$`)

// shellLanguages are the info strings (their first word, in any case)
// markdown renderers show as shell: commands, or a session of them.
var shellLanguages = map[string]bool{"sh": true, "bash": true, "shell": true, "zsh": true, "console": true, "shell-session": true}

// fence parses a line that opens or closes a fenced code block (CommonMark:
// three or more backticks or tildes): its fence characters and info
// string.
func fence(line string) (marks, info string, ok bool) {
	if !strings.HasPrefix(line, "```") && !strings.HasPrefix(line, "~~~") {
		return "", "", false
	}
	n := len(line) - len(strings.TrimLeft(line, line[:1]))
	return line[:n], strings.TrimSpace(line[n:]), true
}

// closes reports whether line closes the block opened by marks: the same
// character, at least as many, and nothing after them.
func closes(line, marks string) bool {
	m, info, ok := fence(line)
	return ok && info == "" && m[0] == marks[0] && len(m) >= len(marks)
}

// fenced is one fenced code block of a document.
type fenced struct {
	line   int    // of the opening fence
	info   string // the info string: the language, maybe attributes after it ("": none)
	marker string // of the docs-test comment on the line before ("": none)
	text   string
}

// language is the block's language (the info string's first word), in
// lower case.
func (f fenced) language() string {
	lang, _, _ := strings.Cut(f.info, " ")
	return strings.ToLower(lang)
}

// fencedBlocks returns every fenced code block of a markdown file, with
// the marker before each; a fence inside a longer one is its text.
func fencedBlocks(path string) ([]fenced, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		blocks []fenced
		cur    *fenced // the block being read
		open   string  // its marks ("": none)
		prev   string  // the line before, trimmed
		lineNo int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		switch {
		case cur != nil && closes(line, open):
			blocks = append(blocks, *cur)
			cur, open = nil, ""
		case cur != nil:
			cur.text += sc.Text() + "\n"
		default:
			marks, info, ok := fence(line)
			if !ok {
				break
			}
			open, cur = marks, &fenced{line: lineNo, info: info}
			if m := markerPattern.FindStringSubmatch(prev); m != nil {
				cur.marker = m[1]
			}
		}
		prev = line
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: unterminated code block", path, cur.line)
	}
	return blocks, sc.Err()
}

// shellBlocks returns the shell blocks of a markdown file with their markers.
func shellBlocks(path string) ([]block, error) {
	fences, err := fencedBlocks(path)
	if err != nil {
		return nil, err
	}
	var blocks []block
	for _, f := range fences {
		if shellLanguages[f.language()] {
			blocks = append(blocks, block{line: f.line, marker: f.marker, text: f.text})
		}
	}
	return blocks, nil
}

// unlabelled returns the lines of the fences of a markdown file that give
// no language: what they hold is never counted, marked or run, so a
// command written in one would go unchecked.
func unlabelled(path string) ([]int, error) {
	fences, err := fencedBlocks(path)
	if err != nil {
		return nil, err
	}
	var lines []int
	for _, f := range fences {
		if f.info == "" {
			lines = append(lines, f.line)
		}
	}
	return lines, nil
}

// How a block is tested, from its marker.
const (
	markRun     = "run"     // against the simulator, go test ./docs
	markCluster = "cluster" // against the control plane holding the test's objects, go test -tags e2e ./docs
	markInstall = "install" // against a new control plane of its own, go test -tags e2e ./docs
	markSkip    = "skip"    // not run; the reason follows
)

// kind returns markRun, markCluster, markInstall or markSkip and, for
// skip, its reason; "" for a missing or malformed marker.
func (b block) kind() (kind, reason string) {
	switch b.marker {
	case markRun, markCluster, markInstall:
		return b.marker, ""
	}
	if r, ok := strings.CutPrefix(b.marker, markSkip+":"); ok && strings.TrimSpace(r) != "" {
		return markSkip, strings.TrimSpace(r)
	}
	return "", ""
}

// docBlock is a block with the document it is in (relative to the
// repository).
type docBlock struct {
	block
	doc string
}

func (b docBlock) String() string { return fmt.Sprintf("%s:%d", b.doc, b.line) }

// allBlocks returns the shell blocks of every markdown file of the
// repository (blockDocuments), in document order, README.md first; a block
// without a valid marker fails t.
func allBlocks(t *testing.T, root string) []docBlock {
	t.Helper()
	var out []docBlock
	for _, doc := range blockDocuments(t, root) {
		rel, _ := filepath.Rel(root, doc)
		blocks, err := shellBlocks(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			if k, _ := b.kind(); k == "" {
				t.Errorf("%s:%d: shell block without a valid marker (%q): put <!-- docs-test: run -->, <!-- docs-test: cluster -->, <!-- docs-test: install --> or <!-- docs-test: skip: <why> --> on the line before it", rel, b.line, b.marker)
			}
			out = append(out, docBlock{block: b, doc: filepath.ToSlash(rel)})
		}
	}
	return out
}

// census says how many blocks each test runs and why the others are
// skipped, for the tests' output.
func census(blocks []docBlock) string {
	count := map[string]int{}
	reasons := map[string]int{}
	var order []string
	docs := map[string]bool{}
	for _, b := range blocks {
		docs[b.doc] = true
		k, r := b.kind()
		count[k]++
		if k == markSkip {
			if reasons[r] == 0 {
				order = append(order, r)
			}
			reasons[r]++
		}
	}
	var skipped []string
	for _, r := range order {
		skipped = append(skipped, fmt.Sprintf("%d: %s", reasons[r], r))
	}
	return fmt.Sprintf("%d shell blocks in %d files: %d run (%d against the simulator by go test ./docs; "+
		"%d against a control plane holding the driver and %d installs on a new control plane each, by go test -tags e2e ./docs), "+
		"%d skipped:\n\t%s",
		len(blocks), len(docs), count[markRun]+count[markCluster]+count[markInstall], count[markRun],
		count[markCluster], count[markInstall], count[markSkip], strings.Join(skipped, "\n\t"))
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

// blockDocuments returns the markdown files whose fenced blocks the tests
// read: every one of the repository (markdownFiles: README.md, CHANGELOG.md,
// docs/, e2e/README.md, hack/README.md, ...), README.md first, the others
// in the order of their paths.
func blockDocuments(t *testing.T, root string) []string {
	t.Helper()
	readme := filepath.Join(root, "README.md")
	docs := []string{readme}
	for _, f := range markdownFiles(t, root) {
		if f != readme {
			docs = append(docs, f)
		}
	}
	return docs
}

// documents returns README.md and docs/*.md: what a user reads.
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
	return runScriptEnv(t, dir, script, limit, nil)
}

// runScriptEnv is runScript with env added to the environment (a later
// value of a name wins: HOME, PATH, KUBECONFIG).
func runScriptEnv(t *testing.T, dir, script string, limit time.Duration, env []string) (out string, err error, hung bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "HOME="+filepath.Join(dir, "home")), env...)
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
