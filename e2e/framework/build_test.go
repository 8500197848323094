package framework

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Tests side by side ask for the same tool at once: one build, one path,
// a binary that runs, and no temporary file left beside it.
func TestGoBuildOnceForConcurrentCallers(t *testing.T) {
	root := t.TempDir()
	for name, body := range map[string]string{
		"go.mod":          "module example.com/tool\n\ngo 1.22\n",
		"cmd/hi/main.go":  "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hi\") }\n",
		".cache/e2e/keep": "",
	} {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tl := NewTimeline(t, t.TempDir())
	b := GoBuild{Name: "hi", Pkg: "./cmd/hi"}
	paths := make([]string, 4)
	var wg sync.WaitGroup
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i] = b.Path(t, tl, root)
		}()
	}
	wg.Wait()
	want := filepath.Join(root, ".cache", "e2e", "hi")
	for _, p := range paths {
		if p != want {
			t.Fatalf("paths %q, want %s for every caller", paths, want)
		}
	}
	out, err := exec.Command(want).Output()
	if err != nil || strings.TrimSpace(string(out)) != "hi" {
		t.Fatalf("%s: %q, %v", want, out, err)
	}
	steps, err := os.ReadFile(tl.Path())
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(steps), "== go build ./cmd/hi: done"); n != 1 {
		t.Errorf("%d builds finished, want 1:\n%s", n, steps)
	}
	left, _ := filepath.Glob(filepath.Join(root, ".cache", "e2e", "*.tmp"))
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
