package docs

import (
	"os"
	"path/filepath"
	"regexp"
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
