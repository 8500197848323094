package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// hack/test-failures.sh, which the Makefile's test targets run when go
// test fails (docs/testing.md), names at the end of the log each failed
// test with its own output, and a package that did not build with its
// compiler errors, in go test's output with and without -v (e2e-kubelet
// and e2e-nvme run -v: there a test's output comes before its --- FAIL
// line, under the === RUN/CONT/NAME lines that say whose it is), and
// panics and timeouts with what follows them.
func TestTestFailuresNamesWhatFailedWithItsOutput(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH")
	}
	mod := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(mod, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/failures\n\ngo 1.22\n")
	write("a/a_test.go", `package a

import "testing"

func TestPasses(t *testing.T) { t.Log("a passing test's line") }

func TestFails(t *testing.T) {
	t.Log("what the test saw")
	t.Error("the reason it failed")
}

func TestSub(t *testing.T) {
	t.Run("ok", func(t *testing.T) { t.Log("a passing subtest's line") })
	t.Run("one", func(t *testing.T) {
		t.Parallel()
		t.Error("the reason of one")
	})
	t.Run("two", func(t *testing.T) {
		t.Parallel()
		t.Error("the reason of two")
	})
}
`)
	write("c/c_test.go", `package c

import "testing"

func TestPanics(t *testing.T) {
	var m map[string]int
	m["the panicking line"] = 1
}
`)
	write("d/d_test.go", `package d

import "testing"

func TestHangs(t *testing.T) {
	t.Log("what the hung test saw")
	select {}
}
`)
	write("b/b.go", "package b\n\nfunc F() int { return notDeclared }\n")
	write("b/b_test.go", "package b\n\nimport \"testing\"\n\nfunc TestB(t *testing.T) { F() }\n")

	script := filepath.Join(repoRoot(t), "hack", "test-failures.sh")
	for _, v := range []bool{false, true} {
		args := []string{"test", "-count=1", "-timeout=2s"}
		if v {
			args = append(args, "-v")
		}
		cmd := exec.Command(goBin, append(args, "./...")...)
		cmd.Dir = mod
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off", "GOTOOLCHAIN=local")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("go test %v passed:\n%s", args, out)
		}
		log := filepath.Join(t.TempDir(), "test.log")
		if err := os.WriteFile(log, out, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := exec.Command(script, log).CombinedOutput()
		if err != nil {
			t.Fatalf("hack/test-failures.sh: %v\n%s", err, got)
		}
		for _, want := range []string{
			"--- FAIL: TestFails", "what the test saw", "the reason it failed",
			"--- FAIL: TestSub/one", "the reason of one", "--- FAIL: TestSub/two", "the reason of two",
			"undefined: notDeclared", "FAIL\texample.com/failures/b [build failed]",
			"--- FAIL: TestPanics", "panic: assignment to entry in nil map", "FAIL\texample.com/failures/c",
			"panic: test timed out after 2s", "TestHangs", "FAIL\texample.com/failures/d",
		} {
			if !strings.Contains(string(got), want) {
				t.Errorf("go test -v=%t: what failed lacks %q:\n%s", v, want, got)
			}
		}
		if v && !strings.Contains(string(got), "what the hung test saw") {
			t.Errorf("go test -v: what failed lacks the output of the test that timed out:\n%s", got)
		}
		for _, unwanted := range []string{"a passing test's line", "a passing subtest's line"} {
			if strings.Contains(string(got), unwanted) {
				t.Errorf("go test -v=%t: what failed has a passing test's output %q:\n%s", v, unwanted, got)
			}
		}
	}
}
