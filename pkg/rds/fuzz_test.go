package rds

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParsePrintDetail: the parser never panics, and every disk it accepts
// has a slot and a non-negative size. The hardware-shaped corpus in
// testdata/routeros seeds it.
func FuzzParsePrintDetail(f *testing.F) {
	for _, s := range []string{realDisk, unnumbered, "", " 0 slot=\"a\" size=1 024", "Flags: X\n 0 X ;;; c\n a=b"} {
		f.Add(s)
	}
	names, err := filepath.Glob(filepath.Join(corpusDir(), "*.txt"))
	if err != nil || len(names) == 0 {
		f.Fatalf("corpus: %v, %d files", err, len(names))
	}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, out string) {
		disks, err := disksFromOutput(out)
		if err != nil {
			return
		}
		for _, d := range disks {
			if d.Slot == "" || d.Size < 0 {
				t.Fatalf("accepted disk %+v from %q", d, out)
			}
		}
	})
}

// FuzzParseSize: accepted sizes are non-negative, and whole binary-unit
// values survive a format/parse round trip.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"53 687 091 200", "50.0GiB", "1.5TiB", "10G", "512", "100 KiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
		if r, err := RoundUpSize(n); err == nil {
			if back, err := ParseSize(FormatSize(r)); err != nil || back != r {
				t.Fatalf("round trip of %d: %d, %v", r, back, err)
			}
		}
	})
}

// FuzzValidateSlot: whatever passes validation is safe to quote into a
// command (no quote, escape, separator, bracket or whitespace).
func FuzzValidateSlot(f *testing.F) {
	for _, s := range hostile {
		f.Add(s)
	}
	f.Add("pvc-1")
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateSlot(s) == nil && strings.ContainsAny(s, "\"\\$;[]{}'` \t\r\n/.") {
			t.Fatalf("ValidateSlot accepted %q", s)
		}
		if ValidateFilePath(s) == nil && strings.ContainsAny(s, "\"\\$;[]{}'` \t\r\n") {
			t.Fatalf("ValidateFilePath accepted %q", s)
		}
		if ValidateNQN(s) == nil && strings.ContainsAny(s, "\"\\$;[]{}'` \t\r\n") {
			t.Fatalf("ValidateNQN accepted %q", s)
		}
	})
}
