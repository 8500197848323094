package rds

import "testing"

// TestSmartValuesThatAreNotDecimalsAreUnreadable: a drive's temperature
// or percentage used printed as an exponent or a hex float ("1e2",
// "0x1p6": strconv.ParseFloat reads both) is unreadable, dropped with an
// error, as the rates and durations are, never a made-up 100 % used or
// 64 C; a negative percentage used is unreadable too. A decimal, and a
// temperature below zero, are read.
func TestSmartValuesThatAreNotDecimalsAreUnreadable(t *testing.T) {
	for _, tc := range []struct {
		key, text string
		want      *float64 // nil: unreadable
	}{
		{"temperature", "1e2C", nil},
		{"temperature", "0x1p6C", nil},
		{"temperature", "+45C", nil},
		{"percentage-used", "1e2%", nil},
		{"percentage-used", "0x64%", nil},
		{"percentage-used", "-5%", nil},
		{"temperature", "45C", ptr(45.0)},
		{"temperature", "-3C", ptr(-3.0)},
		{"percentage-used", "7%", ptr(7.0)},
		{"percentage-used", "7.5%", ptr(7.5)},
	} {
		s, errs := smartFromValues(map[string]string{tc.key: tc.text})
		got := s.Temperature
		if tc.key == "percentage-used" {
			got = s.PercentageUsed
		}
		switch {
		case tc.want == nil && (got != nil || len(errs) != 1):
			t.Errorf("%s %q: read as %v (errors %v); want unreadable", tc.key, tc.text, deref(got), errs)
		case tc.want != nil && (got == nil || *got != *tc.want || len(errs) != 0):
			t.Errorf("%s %q: %v, %v; want %v", tc.key, tc.text, deref(got), errs, *tc.want)
		}
	}
}

func ptr(f float64) *float64 { return &f }

func deref(f *float64) any {
	if f == nil {
		return nil
	}
	return *f
}
