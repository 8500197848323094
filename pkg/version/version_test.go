package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// repoRoot is the repository this package is in.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func run(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.invalid", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// hack/version.sh, the one source of the version, in a repository of its
// own: the release's commit says the release, a commit after it says how
// far and which, uncommitted changes say so, a tag named as VERSION wins,
// and a tree without git history or with a cut one never claims to be the
// release.
func TestVersionScriptNamesTheReleaseOrTheBuildAfterIt(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "hack", "version.sh"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if err := os.MkdirAll(filepath.Join(repo, "hack"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(root, name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(repo, "hack/version.sh", string(script))
	version := func(root string) string {
		t.Helper()
		return run(t, root, "bash", "hack/version.sh")
	}
	run(t, repo, "git", "init", "-q", "-b", "main")
	write(repo, "VERSION", "v0.1.0\n")
	write(repo, "a", "1")
	run(t, repo, "git", "add", ".")
	run(t, repo, "git", "commit", "-q", "-m", "release v0.1.0")
	if got := version(repo); got != "v0.1.0" {
		t.Errorf("at the release's commit: %q, want v0.1.0", got)
	}
	for i := range 2 {
		write(repo, "a", string(rune('2'+i)))
		run(t, repo, "git", "commit", "-q", "-am", "work")
	}
	head := run(t, repo, "git", "rev-parse", "--short=7", "HEAD")
	if got, want := version(repo), "v0.1.0-2-g"+head; got != want {
		t.Errorf("two commits after the release: %q, want %q", got, want)
	}
	write(repo, "a", "changed")
	if got, want := version(repo), "v0.1.0-2-g"+head+"-dirty"; got != want {
		t.Errorf("with a changed tracked file: %q, want %q", got, want)
	}
	run(t, repo, "git", "checkout", "-q", "a")
	write(repo, ".git/info/exclude", "bin/\n")
	if err := os.MkdirAll(filepath.Join(repo, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(repo, "bin/output", "x")
	if got, want := version(repo), "v0.1.0-2-g"+head; got != want {
		t.Errorf("with an ignored file (a build output): %q, want %q", got, want)
	}
	// The next release: VERSION changes in its commit.
	write(repo, "VERSION", "v0.2.0\n")
	run(t, repo, "git", "commit", "-q", "-am", "release v0.2.0")
	if got := version(repo); got != "v0.2.0" {
		t.Errorf("at the next release's commit: %q, want v0.2.0", got)
	}
	// A tag named as VERSION, put on a later commit, wins.
	write(repo, "a", "fix")
	run(t, repo, "git", "commit", "-q", "-am", "fix")
	run(t, repo, "git", "tag", "v0.2.0")
	if got := version(repo); got != "v0.2.0" {
		t.Errorf("at the tag v0.2.0: %q, want v0.2.0", got)
	}
	write(repo, "a", "more")
	run(t, repo, "git", "commit", "-q", "-am", "more")
	head = run(t, repo, "git", "rev-parse", "--short=7", "HEAD")
	if got, want := version(repo), "v0.2.0-1-g"+head; got != want {
		t.Errorf("a commit after the tag: %q, want %q", got, want)
	}

	// A shallow clone cannot count: it says so, never the bare release.
	shallow := filepath.Join(dir, "shallow")
	run(t, dir, "git", "clone", "-q", "--no-tags", "--depth=1", "file://"+repo, shallow)
	if got, want := version(shallow), "v0.2.0-dev-g"+head; got != want {
		t.Errorf("a shallow clone: %q, want %q", got, want)
	}
	// A source archive has no history at all.
	plain := filepath.Join(dir, "plain")
	if err := os.MkdirAll(filepath.Join(plain, "hack"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(plain, "hack/version.sh", string(script))
	write(plain, "VERSION", "v0.2.0\n")
	if got := version(plain); got != "v0.2.0-dev" {
		t.Errorf("without git: %q, want v0.2.0-dev", got)
	}
	// A VERSION that is not a version is refused.
	write(plain, "VERSION", "0.2\n")
	cmd := exec.Command("bash", "hack/version.sh")
	cmd.Dir = plain
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "not vMAJOR.MINOR.PATCH") {
		t.Errorf("VERSION 0.2: %v, %q; want a refusal naming the format", err, out)
	}
}

// versionRepo is a git repository of its own holding hack/version.sh
// and VERSION (v0.2.0, committed as the release's commit), with helpers
// to write files, run git and ask the script.
type versionRepo struct {
	t   *testing.T
	dir string
}

func newVersionRepo(t *testing.T) *versionRepo {
	t.Helper()
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "hack", "version.sh"))
	if err != nil {
		t.Fatal(err)
	}
	r := &versionRepo{t: t, dir: filepath.Join(t.TempDir(), "repo")}
	if err := os.MkdirAll(filepath.Join(r.dir, "hack"), 0o755); err != nil {
		t.Fatal(err)
	}
	r.write("hack/version.sh", string(script))
	r.git("init", "-q", "-b", "main")
	r.write("VERSION", "v0.2.0\n")
	r.write("a", "1")
	r.git("add", ".")
	r.git("commit", "-q", "-m", "release v0.2.0")
	return r
}

func (r *versionRepo) write(name, text string) {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.dir, name), []byte(text), 0o755); err != nil {
		r.t.Fatal(err)
	}
}

func (r *versionRepo) git(args ...string) string {
	r.t.Helper()
	return run(r.t, r.dir, "git", args...)
}

// version runs hack/version.sh; it must succeed and print a version.
func (r *versionRepo) version() string {
	r.t.Helper()
	cmd := exec.Command("bash", "hack/version.sh")
	cmd.Dir = r.dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		r.t.Fatalf("hack/version.sh printed %q (%v) %s; every make target stops on an empty version", out, err, stderr)
	}
	return strings.TrimSpace(string(out))
}

// A tag named as VERSION that is not in HEAD's history (the release
// tagged on a release branch after a fix there, while main goes on from
// the commit that set VERSION): git describe cannot reach it, and the
// version is counted from VERSION's commit as without the tag. Before,
// hack/version.sh printed nothing and exited 128, and every make target
// (make build, make test, make release) stopped with "hack/version.sh
// printed no version".
func TestVersionScriptCountsFromVERSIONWhenTheTagIsNotInTheHistory(t *testing.T) {
	r := newVersionRepo(t)
	r.git("checkout", "-q", "-b", "release-0.2")
	r.write("a", "fix")
	r.git("commit", "-q", "-am", "fix on the release branch")
	r.git("tag", "v0.2.0")
	r.git("checkout", "-q", "main")
	r.write("b", "work")
	r.git("add", "b")
	r.git("commit", "-q", "-m", "work on main")
	head := r.git("rev-parse", "--short=7", "HEAD")
	if got, want := r.version(), "v0.2.0-1-g"+head; got != want {
		t.Errorf("main, one commit after VERSION's, the tag v0.2.0 on a release branch: %q, want %q", got, want)
	}
}

// A source file that is in no commit is in the binary as much as a
// changed tracked one: a build with one must not claim to be the commit.
// Go's own VCS stamp counts it (vcs.modified from git status
// --porcelain), and make release refuses such a tree for that reason ("a
// changed or new file would be in the release and in no commit"); with
// RELEASE_ALLOW_DIRTY=1 it was released under the clean version. Ignored
// files (bin/, .cache/, dist/: build outputs) are not part of the build.
func TestVersionScriptCallsAnUntrackedSourceDirty(t *testing.T) {
	r := newVersionRepo(t)
	r.write(".gitignore", "bin/\n")
	r.git("add", ".gitignore")
	r.git("commit", "-q", "-m", "ignore bin/")
	head := r.git("rev-parse", "--short=7", "HEAD")
	if err := os.MkdirAll(filepath.Join(r.dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	r.write("bin/rds-csi-driver", "a build output")
	if got, want := r.version(), "v0.2.0-1-g"+head; got != want {
		t.Errorf("with an ignored build output: %q, want %q", got, want)
	}
	r.write("extra.go", "package main\n")
	if got, want := r.version(), "v0.2.0-1-g"+head+"-dirty"; got != want {
		t.Errorf("with an untracked source file extra.go, built into the binary: %q, want %q", got, want)
	}
}

// Every binary of the repository prints the version it was built with,
// alone on a line (`--version`; kubectl-rds also `version`, as kubectl
// plugins do), and nothing else, so scripts can compare it.
func TestEveryBinaryPrintsItsVersion(t *testing.T) {
	const v = "v9.8.7-3-gabcdef0-dirty"
	bin := t.TempDir()
	// The flags of the docs test's build (go build ./cmd/...), whose
	// compiled packages this shares; only the link differs.
	cmd := exec.Command("go", "build", "-ldflags", LDFlag(v), "-o", bin+string(filepath.Separator), "./cmd/...")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/...: %v\n%s", err, out)
	}
	cmds, err := os.ReadDir(filepath.Join(repoRoot(t), "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range cmds {
		calls := [][]string{{"--version"}}
		if c.Name() == "kubectl-rds" {
			calls = append(calls, []string{"version"})
		}
		for _, args := range calls {
			out, err := exec.Command(filepath.Join(bin, c.Name()), args...).Output()
			if err != nil {
				t.Errorf("%s %s: %v", c.Name(), args[0], err)
				continue
			}
			if string(out) != v+"\n" {
				t.Errorf("%s %s printed %q, want %q", c.Name(), args[0], out, v+"\n")
			}
			n++
		}
	}
	if n < 5 {
		t.Errorf("only %d binaries checked; cmd/ has rds-csi-driver, rds-sim, rdsctl, kubectl-rds", n)
	}
}

// The files that name the release agree with VERSION: the chart's version
// and appVersion (the image tag it deploys), the manifests' image, the
// krew manifest's version and its download addresses, and CHANGELOG.md
// has the release's section.
func TestReleaseFilesNameTheRelease(t *testing.T) {
	root := repoRoot(t)
	read := func(name string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	release := strings.TrimSpace(string(read("VERSION")))
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(release) {
		t.Fatalf("VERSION %q is not vMAJOR.MINOR.PATCH", release)
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(read("charts/rds-csi/Chart.yaml"), &chart); err != nil {
		t.Fatal(err)
	}
	if chart.AppVersion != release || chart.Version != strings.TrimPrefix(release, "v") {
		t.Errorf("charts/rds-csi/Chart.yaml: version %s, appVersion %s; want %s, %s", chart.Version, chart.AppVersion, strings.TrimPrefix(release, "v"), release)
	}
	var values struct {
		Image struct{ Tag string } `json:"image"`
	}
	if err := yaml.Unmarshal(read("charts/rds-csi/values.yaml"), &values); err != nil {
		t.Fatal(err)
	}
	if values.Image.Tag != "" {
		t.Errorf("charts/rds-csi/values.yaml: image.tag %q; want empty (the appVersion)", values.Image.Tag)
	}
	for _, f := range []string{"manifests/base/controller.yaml", "manifests/base/node.yaml"} {
		if !strings.Contains(string(read(f)), "image: ghcr.io/srvlab/rds-csi-driver:"+release+"\n") {
			t.Errorf("%s does not run ghcr.io/srvlab/rds-csi-driver:%s", f, release)
		}
	}
	var krew struct {
		Spec struct {
			Version   string `json:"version"`
			Platforms []struct {
				URI string `json:"uri"`
			} `json:"platforms"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(read("krew/rds.yaml"), &krew); err != nil {
		t.Fatal(err)
	}
	if krew.Spec.Version != release {
		t.Errorf("krew/rds.yaml: version %s, want %s", krew.Spec.Version, release)
	}
	for _, p := range krew.Spec.Platforms {
		if !strings.Contains(p.URI, "/download/"+release+"/") {
			t.Errorf("krew/rds.yaml: %s is not the release %s's", p.URI, release)
		}
	}
	if !regexp.MustCompile(`(?m)^## \[` + regexp.QuoteMeta(strings.TrimPrefix(release, "v")) + `\] - \d{4}-\d{2}-\d{2}$`).Match(read("CHANGELOG.md")) {
		t.Errorf("CHANGELOG.md has no section \"## [%s] - YYYY-MM-DD\"", strings.TrimPrefix(release, "v"))
	}
}
