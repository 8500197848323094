package rds

import (
	"errors"
	"math"
	"testing"
)

// notNumbers are values Go's strconv.ParseFloat reads as numbers but
// RouterOS never prints as one: NaN and the infinities (NaN compares false
// with every bound, so a range check alone lets it through), an exponent
// and a hex float.
var notNumbers = []string{"NaN", "nan", "Inf", "+Inf", "-Inf", "infinity", "1e3", "0x1p-2"}

// TestHealthValuesThatAreNotNumbersAreUnreadable: a rate or a duration
// that is NaN, an infinity, an exponent or hex (in the unit form and in
// each part of hh:mm:ss) is unreadable like any other: ParseRate and
// ParseDuration refuse it with ErrBadOutput, the statistics entry that
// carries it is skipped and counted, and monitor-traffic output with it
// is refused. Never a NaN, a negative or a made-up value reported.
func TestHealthValuesThatAreNotNumbersAreUnreadable(t *testing.T) {
	for _, n := range notNumbers {
		for _, unit := range []string{"bps", "kbps", "Mbps", "Bps", "GBps"} {
			if r, err := ParseRate(n + unit); !errors.Is(err, ErrBadOutput) {
				t.Errorf("ParseRate(%q) = %v, %v; want ErrBadOutput", n+unit, r, err)
			}
		}
		durations := []string{n + "s", n + "ms", n, n + ":00:00", "00:" + n + ":00", "00:00:" + n, "01:02:" + n}
		for _, d := range durations {
			if got, err := ParseDuration(d); !errors.Is(err, ErrBadOutput) {
				t.Errorf("ParseDuration(%q) = %v (%d ns), %v; want ErrBadOutput", d, got, int64(got), err)
			}
		}
		values := []struct{ key, text string }{
			{"read-rate", n + "bps"}, {"write-rate", n + "Mbps"},
			{"active-time", "00:00:" + n}, {"wait-time", n + ":00:00"}, {"active-time", n + "s"},
		}
		for _, v := range values {
			// One volume with an unreadable value beside one without.
			out := " 0 type=file slot=\"bad\" read-ops=1 " + v.key + "=" + v.text + "\n 1 type=file slot=\"good\" read-ops=2\n"
			st := StatsFromListing(mustListing(t, out))
			if s, ok := st.Disks["bad"]; ok {
				t.Errorf("%s=%s: statistics kept as %+v; want the entry skipped", v.key, v.text, s.IO)
			}
			if len(st.Skipped) != 1 || !errors.Is(st.Skipped[0].Err, ErrBadOutput) {
				t.Errorf("%s=%s: skipped %+v; want the one entry, ErrBadOutput", v.key, v.text, st.Skipped)
			}
			if st.Disks["good"].IO.ReadOps != 2 {
				t.Errorf("%s=%s: the readable entry beside it: %+v", v.key, v.text, st.Disks["good"])
			}
			if s, err := ParseMonitorTraffic("  read-ops: 1\n  " + v.key + ": " + v.text + "\n"); !errors.Is(err, ErrBadOutput) {
				t.Errorf("monitor-traffic %s: %s = %+v, %v; want ErrBadOutput", v.key, v.text, s, err)
			}
		}
	}
	// The readable forms beside them still read.
	for in, want := range map[string]float64{"12.8Mbps": 1.6e6, "8bps": 1, "1.5kBps": 1500} {
		if got, err := ParseRate(in); err != nil || got != want || math.IsNaN(got) {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if got, err := ParseDuration("01:02:03.5"); err != nil || got.Seconds() != 3723.5 {
		t.Errorf("ParseDuration(01:02:03.5) = %v, %v", got, err)
	}
}
