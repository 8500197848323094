package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestFactsTableMatchesSelftest: docs/routeros.md's facts table has one
// row per fact the self-test reports, in the same order, and no other.
func TestFactsTableMatchesSelftest(t *testing.T) {
	doc, err := os.ReadFile("../../docs/routeros.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Facts the driver relies on\n")
	if !ok {
		t.Fatal(`docs/routeros.md has no "## Facts the driver relies on" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `([a-z-]+)` \\|")
	var ids []string
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		ids = append(ids, m[1])
	}
	var want []string
	for _, f := range selftestFacts {
		want = append(want, f.id)
	}
	if strings.Join(ids, " ") != strings.Join(want, " ") {
		t.Errorf("the table's rows:\n%s\nthe self-test's facts:\n%s", strings.Join(ids, " "), strings.Join(want, " "))
	}
}
