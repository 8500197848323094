package rds

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"512", 512},
		{"53 687 091 200", 53687091200},
		{"1 099 511 627 776", 1 << 40},
		{"50.0GiB", 50 << 30},
		{"1024.0GiB", 1 << 40},
		{"1.5GiB", 3 << 29},
		{"10G", 10 << 30},
		{"10g", 10 << 30},
		{"1.5TiB", 3 << 39},
		{"100 KiB", 100 << 10},
		{"100k", 100 << 10},
		{"2M", 2 << 20},
		{"2MB", 2 << 20},
		{"12.3MiB", 12897485}, // display-rounded: nearest byte
		{"  7 ", 7},
	}
	for _, tc := range tests {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "G", "1.2.3G", ".5G", "5.G", "10 XB", "12 34", "1 2345", "-1", "99999999999999999999T", "1e9"} {
		if _, err := ParseSize(bad); !errors.Is(err, ErrBadOutput) {
			t.Errorf("ParseSize(%q): got %v, want ErrBadOutput", bad, err)
		}
	}
}

func TestRoundUpAndFormat(t *testing.T) {
	tests := []struct {
		req      int64
		rounded  int64
		argument string
	}{
		{1, MiB, "1M"},
		{MiB, MiB, "1M"},
		{MiB + 1, 2 * MiB, "2M"},
		{3 * GiB / 2, 3 * GiB / 2, "1536M"}, // never "1G"
		{GiB, GiB, "1G"},
		{10*GiB - 1, 10 * GiB, "10G"},
		{TiB, TiB, "1T"},
		{TiB + MiB, TiB + MiB, "1048577M"},
	}
	for _, tc := range tests {
		got, err := RoundUpSize(tc.req)
		if err != nil || got != tc.rounded {
			t.Errorf("RoundUpSize(%d) = %d, %v; want %d", tc.req, got, err, tc.rounded)
			continue
		}
		if got < tc.req {
			t.Errorf("RoundUpSize(%d) rounded down to %d", tc.req, got)
		}
		if s := FormatSize(got); s != tc.argument {
			t.Errorf("FormatSize(%d) = %q, want %q", got, s, tc.argument)
		}
		// The argument reads back as exactly the rounded size.
		if back, err := ParseSize(FormatSize(got)); err != nil || back != got {
			t.Errorf("ParseSize(FormatSize(%d)) = %d, %v", got, back, err)
		}
	}
	for _, bad := range []int64{0, -1, math.MaxInt64} {
		if _, err := RoundUpSize(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("RoundUpSize(%d): got %v, want ErrInvalidArgument", bad, err)
		}
	}
	if s := FormatSize(1000); s != "1000" {
		t.Errorf("FormatSize(1000) = %q", s)
	}
}

// A size a person typed is read exactly or refused with an
// ErrInvalidArgument that names it: never rounded to another size, never
// blamed on RouterOS.
func TestParseSizeArgument(t *testing.T) {
	good := []struct {
		in   string
		want int64
	}{
		{"1073741824", GiB},
		{"10G", 10 * GiB},
		{"1536M", 1536 * MiB},
		{"1.5G", 3 * GiB / 2},
		{"512", 512},
		{"1 073 741 824", GiB},
	}
	for _, tc := range good {
		if got, err := ParseSizeArgument(tc.in); err != nil || got != tc.want {
			t.Errorf("ParseSizeArgument(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	bad := []struct{ in, says string }{
		{"1.5", "is 1.5 bytes, not a whole number of bytes"},
		{"0.1G", "not a whole number of bytes"},
		{"0", "more than 0 bytes"},
		{"0G", "more than 0 bytes"},
		{"abc", "is not a number"},
		{"-1G", "is not a number"},
		{"10 XB", "is not a number"},
		{"1 2345", "malformed digit groups"},
		{"99999999999T", "too large"},
	}
	for _, tc := range bad {
		_, err := ParseSizeArgument(tc.in)
		if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrBadOutput) {
			t.Errorf("ParseSizeArgument(%q): %v, want ErrInvalidArgument", tc.in, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("%q", tc.in)) || !strings.Contains(msg, tc.says) || strings.Contains(msg, "RouterOS") {
			t.Errorf("ParseSizeArgument(%q): %q does not name the input and say %q", tc.in, msg, tc.says)
		}
	}
}

// A size argument that is accepted is exactly what RouterOS' own form of
// it reads as, and positive; one that is refused is an invalid argument.
func FuzzParseSizeArgument(f *testing.F) {
	for _, s := range []string{"1.5", "10G", "1 073 741 824", "0.5k", "0", "1e9", "99999999999T", " 7 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSizeArgument(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("ParseSizeArgument(%q): %v, not ErrInvalidArgument", s, err)
			}
			return
		}
		if back, err := ParseSize(s); n <= 0 || err != nil || back != n {
			t.Fatalf("ParseSizeArgument(%q) = %d, but ParseSize reads %d, %v", s, n, back, err)
		}
	})
}
