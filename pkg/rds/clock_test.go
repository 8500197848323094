package rds

import (
	"errors"
	"testing"
	"time"
)

// TestRouterOSTimesInBothDateForms: the RDS's clock and a file's
// last-modified are read in RouterOS 7.10's date form (2026-11-22) and the
// earlier one (nov/22/2026, the month in any case); anything else is
// unreadable: the clock an error, a file's time zero (its age unknown).
func TestRouterOSTimesInBothDateForms(t *testing.T) {
	want := time.Date(2026, 11, 22, 10, 0, 1, 0, time.UTC)
	for _, date := range []string{"2026-11-22", "nov/22/2026", "Nov/22/2026", " 2026-11-22 "} {
		if got, err := parseRouterOSTime(date, "10:00:01"); err != nil || !got.Equal(want) {
			t.Errorf("parseRouterOSTime(%q) = %v, %v; want %v", date, got, err, want)
		}
		if got := parseLastModified(date + " 10:00:01"); !got.Equal(want) {
			t.Errorf("parseLastModified(%q) = %v; want %v", date+" 10:00:01", got, want)
		}
	}
	for _, c := range [][2]string{{"", ""}, {"2026-11-22", ""}, {"22.11.2026", "10:00:01"}, {"2026-11-22", "25:00:00"}, {"NaN", "10:00:01"}} {
		if got, err := parseRouterOSTime(c[0], c[1]); !errors.Is(err, ErrBadOutput) {
			t.Errorf("parseRouterOSTime(%q, %q) = %v, %v; want ErrBadOutput", c[0], c[1], got, err)
		}
		if got := parseLastModified(c[0] + " " + c[1]); !got.IsZero() {
			t.Errorf("parseLastModified(%q) = %v; want zero", c[0]+" "+c[1], got)
		}
	}
	// As the hardware corpus prints it, broken across lines and rejoined.
	l := mustListing(t, readCorpus(t, "file-type-and-time-split.txt"))
	f, err := fileFromEntry(l.Entries[1])
	if err != nil || !f.Modified.Equal(time.Date(2026, 11, 22, 10, 0, 2, 0, time.UTC)) {
		t.Errorf("the corpus file's last-modified: %+v, %v", f, err)
	}
}
