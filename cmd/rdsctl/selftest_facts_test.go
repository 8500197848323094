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

// TestFlagColumnsFact reads the RDS2216 captures of issue 22 (items 1, 2;
// pkg/rds/testdata/routeros) as confirming the flag columns, and flags
// compacted into a narrower field as contradicting them.
func TestFlagColumnsFact(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile("../../pkg/rds/testdata/routeros/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct{ name, out, want string }{
		{"RDS2216 RAID members and array", read("disk-raid-flag-columns.txt"), confirmed},
		{"mounted image beside exported disks", read("disk-mounted-image-beside-exported.txt"), confirmed},
		{"compacted", "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\r\n 0 BM type=file slot=\"a\"\r\n\r\n 1 Bt type=file slot=\"b\"\r\n", contradicted},
		{"every flag set", "Flags: B - BLOCK-DEVICE; t - NVME-TCP-EXPORT\n 0 Bt type=file slot=\"a\"\n", skipped},
		{"no legend", " 0 name=a.img type=.img file\n", skipped},
	} {
		if got, measured := flagColumnsFact(tc.out); got != tc.want {
			t.Errorf("%s: %s (%s), want %s", tc.name, got, measured, tc.want)
		}
	}
}

func TestLegendUsedFact(t *testing.T) {
	for _, tc := range []struct{ name, out, want string }{
		{"each letter carried", "Flags: B - BLOCK-DEVICE; t - NVME-TCP-EXPORT\n 0 Bt type=file slot=\"a\"\n 1 B  type=file slot=\"b\"\n", confirmed},
		{"a letter no entry carries", "Flags: B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT\n 0 B t type=file slot=\"a\"\n", contradicted},
		{"no entry", "Flags: B - BLOCK-DEVICE\n", skipped},
	} {
		if got, measured := legendUsedFact(tc.out); got != tc.want {
			t.Errorf("%s: %s (%s), want %s", tc.name, got, measured, tc.want)
		}
	}
}
