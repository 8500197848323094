package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Every fence a markdown renderer shows as shell is a shell block the
// tests count, mark and check: a fence of tildes or of more than three
// backticks, an info string with attributes after the language or in
// another case, and the languages renderers highlight as shell sessions
// (console, shell-session, zsh). Before, each of these was read as some
// other language: never run, never checked, never counted, with no marker
// asked for. A fence inside a longer one is its text, not a block.
func TestEveryShellFenceIsABlock(t *testing.T) {
	md := "# doc\n\n" +
		"<!-- docs-test: skip: one -->\n```sh\nbin/rdsctl probe\n```\n\n" +
		"<!-- docs-test: skip: two -->\n~~~sh\nbin/rdsctl list\n~~~\n\n" +
		"<!-- docs-test: skip: three -->\n````bash\nbin/rdsctl get a\n```\nstill the same block\n````\n\n" +
		"<!-- docs-test: skip: four -->\n```sh title=\"example\"\nbin/rdsctl capacity\n```\n\n" +
		"<!-- docs-test: skip: five -->\n```Bash\nbin/rdsctl probe\n```\n\n" +
		"<!-- docs-test: skip: six -->\n```console\n$ bin/rdsctl probe\n```\n\n" +
		"<!-- docs-test: skip: seven -->\n```shell-session\n$ bin/rdsctl probe\n```\n\n" +
		"<!-- docs-test: skip: eight -->\n```zsh\nbin/rdsctl probe\n```\n\n" +
		"```yaml\nkey: value\n```\n\n" +
		"~~~~\n```sh\nnot a block: inside a tilde fence\n```\n~~~~\n"
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	blocks, err := shellBlocks(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"one", "two", "three", "four", "five", "six", "seven", "eight"}
	if len(blocks) != len(want) {
		t.Fatalf("%d shell blocks, want %d: %+v", len(blocks), len(want), blocks)
	}
	for i, b := range blocks {
		if k, r := b.kind(); k != markSkip || r != want[i] {
			t.Errorf("block %d (line %d): kind %q %q, want skip %q", i, b.line, k, r, want[i])
		}
	}
	if got := blocks[2].text; got != "bin/rdsctl get a\n```\nstill the same block\n" {
		t.Errorf("the four-backtick block's text: %q", got)
	}
}

// Every fenced block of the documents the tests read names its language.
// A fence without one is neither a shell block nor anything else: a
// command written in it was never counted, marked, run or checked.
func TestEveryFenceHasALanguage(t *testing.T) {
	root := repoRoot(t)
	for _, doc := range blockDocuments(t, root) {
		lines, err := unlabelled(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for _, l := range lines {
			t.Errorf("%s:%d: a fence without a language: name one (text for a diagram or an output; sh, or console for a transcript, for commands, with a docs-test marker)", filepath.ToSlash(rel), l)
		}
		misplaced, err := markedNotShell(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range misplaced {
			t.Errorf("%s:%d: a docs-test marker (%q) before a %q block, which no test reads as commands: give the block a shell language, or drop the marker", filepath.ToSlash(rel), f.line, f.marker, f.info)
		}
	}
}

// markedNotShell returns the fences of a markdown file that carry a
// docs-test marker but are not shell blocks: the marker says a test runs
// or checks them, and none does.
func markedNotShell(path string) ([]fenced, error) {
	fences, err := fencedBlocks(path)
	if err != nil {
		return nil, err
	}
	var out []fenced
	for _, f := range fences {
		if f.marker != "" && !shellLanguages[f.language()] {
			out = append(out, f)
		}
	}
	return out, nil
}

// The fences unlabelled finds: a fence of backticks or tildes with no
// info string, and no other (a fence with a language, a fence inside a
// longer one, a closing fence).
func TestUnlabelledFences(t *testing.T) {
	md := "# doc\n\n" +
		"```\ndiagram\n```\n\n" + // line 3
		"```text\noutput\n```\n\n" +
		"~~~\nmore\n~~~\n\n" + // line 11
		"````sh\n```\nnot a fence\n```\n````\n\n" +
		"  ```   \nindented, spaces after\n  ```\n" // line 21
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	lines, err := unlabelled(path)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(lines) != "[3 11 21]" {
		t.Errorf("unlabelled fences at lines %v, want [3 11 21]", lines)
	}
}

// A docs-test marker before a block that is not shell is found: before,
// such a block (a command given the language text, say) looked marked,
// and was never run nor checked.
func TestMarkerBeforeAnotherLanguage(t *testing.T) {
	md := "# doc\n\n" +
		"<!-- docs-test: run -->\n```text\nbin/rdsctl probe\n```\n\n" + // line 4
		"<!-- docs-test: skip: why -->\n```sh\nbin/rdsctl probe\n```\n\n" +
		"<!-- docs-test: skip: why -->\n```\nbin/rdsctl probe\n```\n\n" + // line 14
		"```yaml\nkey: value\n```\n"
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := markedNotShell(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []int
	for _, f := range got {
		lines = append(lines, f.line)
	}
	if fmt.Sprint(lines) != "[4 14]" {
		t.Errorf("marked blocks that are not shell at lines %v, want [4 14]", lines)
	}
}
