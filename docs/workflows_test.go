package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The GitHub workflows cannot run here (make lint runs actionlint on
// them); what they run must be what the documentation tells a person to
// run. Every `make TARGET` in a workflow's steps is a target of the
// Makefile and one README.md or docs/ names; the pull request workflow
// runs the tests, the tag workflow makes the release with make release and
// checks its tag against hack/version.sh, and both check out the whole
// history (the version and the upgrade tests read it).
func TestWorkflowsRunTheDocumentedMakeTargets(t *testing.T) {
	root := repoRoot(t)
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var documented strings.Builder
	for _, d := range documents(t, root) {
		b, err := os.ReadFile(d)
		if err != nil {
			t.Fatal(err)
		}
		documented.Write(b)
	}
	files, err := filepath.Glob(filepath.Join(root, ".github", "workflows", "*.yml"))
	if err != nil {
		t.Fatal(err)
	}
	// make as a command: at a line's start or after ; && || | (
	makeCall := regexp.MustCompile(`(?m)(?:^\s*|[;&|(]\s*)make\s+([a-z0-9-]+)`)
	runs := map[string][]string{} // workflow file -> make targets
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var wf struct {
			Jobs map[string]struct {
				Steps []struct {
					Uses string         `json:"uses"`
					Run  string         `json:"run"`
					With map[string]any `json:"with"`
				} `json:"steps"`
			} `json:"jobs"`
		}
		if err := yaml.Unmarshal(b, &wf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		name := filepath.Base(f)
		for job, j := range wf.Jobs {
			for _, s := range j.Steps {
				if strings.HasPrefix(s.Uses, "actions/checkout@") {
					if d, ok := s.With["fetch-depth"].(float64); !ok || d != 0 {
						t.Errorf("%s, job %s: actions/checkout without fetch-depth: 0 (hack/version.sh and the upgrade tests read the history)", name, job)
					}
				}
				for _, m := range makeCall.FindAllStringSubmatch(s.Run, -1) {
					target := m[1]
					runs[name] = append(runs[name], target)
					if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
						t.Errorf("%s runs make %s, which is not a Makefile target", name, target)
					}
					if !strings.Contains(documented.String(), "make "+target) {
						t.Errorf("%s runs make %s, which neither README.md nor docs/ names", name, target)
					}
				}
			}
		}
	}
	has := func(file, target string) bool {
		for _, tg := range runs[file] {
			if tg == target {
				return true
			}
		}
		return false
	}
	if !has("test.yml", "test-host") || !has("test.yml", "e2e-nvme") {
		t.Errorf("test.yml runs %v; want make test-host and make e2e-nvme (the tiers of make test)", runs["test.yml"])
	}
	if !has("release.yml", "release") {
		t.Errorf("release.yml runs %v; want make release", runs["release.yml"])
	}
	rel, err := os.ReadFile(filepath.Join(root, ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hack/version.sh", "cosign sign", "helm push", "id-token: write"} {
		if !strings.Contains(string(rel), want) {
			t.Errorf("release.yml has no %q", want)
		}
	}
}

// The tag workflow holds the keys to the project's name: a GITHUB_TOKEN
// that can push packages and write releases, and an OIDC token cosign
// turns into a signature in the project's identity. Least privilege: a
// job that builds (runs make: apt packages, Go modules, syft, the
// project's own scripts) holds no write permission and no OIDC token, so
// nothing a build runs can push or sign; id-token: write is only in a job
// that runs cosign, packages: write only in one that pushes to the
// registry, contents: write only in one that writes the GitHub release.
// A job holding any of them runs only actions pinned to a commit (a tag
// of a third-party action can be moved to other code).
func TestWorkflowsGrantWritesOnlyToTheJobsThatPublish(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, ".github", "workflows", "*.yml"))
	if err != nil {
		t.Fatal(err)
	}
	pinned := regexp.MustCompile(`^[^@]+@[0-9a-f]{40}$`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var wf struct {
			Permissions map[string]string `json:"permissions"`
			Jobs        map[string]struct {
				Permissions map[string]string `json:"permissions"`
				Steps       []struct {
					Uses string `json:"uses"`
					Run  string `json:"run"`
				} `json:"steps"`
			} `json:"jobs"`
		}
		if err := yaml.Unmarshal(b, &wf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		name := filepath.Base(f)
		if wf.Permissions == nil {
			t.Errorf("%s: no top-level permissions (the default token may write to everything)", name)
		}
		for job, j := range wf.Jobs {
			perms := j.Permissions
			if perms == nil {
				perms = wf.Permissions
			}
			var run strings.Builder
			for _, s := range j.Steps {
				run.WriteString(s.Run + "\n")
			}
			script := run.String()
			needs := map[string]bool{
				"id-token": strings.Contains(script, "cosign "),
				"packages": regexp.MustCompile(`crane"? (push|index|copy|cp|tag)|helm push`).MatchString(script),
				"contents": strings.Contains(script, "gh release"),
			}
			var writes []string
			for scope, level := range perms {
				if level != "write" {
					continue
				}
				writes = append(writes, scope)
				if !needs[scope] {
					t.Errorf("%s, job %s: %s: write, but the job does not use it", name, job, scope)
				}
			}
			if len(writes) == 0 {
				continue
			}
			sort.Strings(writes)
			if regexp.MustCompile(`(?m)(^|[;&|(]\s*)make\s`).MatchString(script) {
				t.Errorf("%s, job %s: builds (runs make) while holding %v: build in a job without them and hand dist/ over as an artifact", name, job, writes)
			}
			for _, s := range j.Steps {
				if s.Uses != "" && !strings.HasPrefix(s.Uses, "./") && !pinned.MatchString(s.Uses) {
					t.Errorf("%s, job %s (holding %v): %s is not pinned to a commit", name, job, writes, s.Uses)
				}
			}
		}
	}
}
