package rds

import (
	"fmt"
	"math"
	"math/big"
	"strings"
)

const (
	KiB int64 = 1 << 10
	MiB int64 = 1 << 20
	GiB int64 = 1 << 30
	TiB int64 = 1 << 40

	// Granularity is the unit the client rounds requested sizes up to. A
	// whole MiB is expressible in RouterOS' `M` suffix and is a multiple of
	// every sector size RouterOS uses.
	Granularity = MiB
)

// RoundUpSize returns the smallest multiple of Granularity that is >= size.
// It never rounds down; sizes <= 0 are invalid.
func RoundUpSize(size int64) (int64, error) {
	if size <= 0 {
		return 0, fmt.Errorf("%w: size %d must be positive", ErrInvalidArgument, size)
	}
	if size > math.MaxInt64-Granularity+1 {
		return 0, fmt.Errorf("%w: size %d is too large", ErrInvalidArgument, size)
	}
	return (size + Granularity - 1) / Granularity * Granularity, nil
}

// FormatSize renders a size for a `file-size=` argument with the largest
// binary suffix that expresses it exactly. Callers pass a size already
// rounded by RoundUpSize; other sizes fall back to bare bytes.
func FormatSize(size int64) string {
	for _, u := range []struct {
		suffix string
		unit   int64
	}{{"T", TiB}, {"G", GiB}, {"M", MiB}, {"k", KiB}} {
		if size >= u.unit && size%u.unit == 0 {
			return fmt.Sprintf("%d%s", size/u.unit, u.suffix)
		}
	}
	return fmt.Sprintf("%d", size)
}

var unitMultipliers = map[string]int64{
	"": 1, "b": 1,
	"k": KiB, "kb": KiB, "kib": KiB,
	"m": MiB, "mb": MiB, "mib": MiB,
	"g": GiB, "gb": GiB, "gib": GiB,
	"t": TiB, "tb": TiB, "tib": TiB,
}

// ParseSize reads the size forms RouterOS prints and accepts:
// "53 687 091 200" (spaces as thousands separators), "50.0GiB", "10G",
// "1.5TiB", "100 KiB", "512". Fractional values are display-rounded by
// RouterOS, so they are converted to the nearest byte. It reads RouterOS'
// output: errors are ErrBadOutput. A size a person typed goes through
// ParseSizeArgument.
func ParseSize(s string) (int64, error) {
	r, problem := parseSize(s)
	if r == nil {
		return 0, fmt.Errorf("%w: size %q %s", ErrBadOutput, s, problem)
	}
	// Round half up to the nearest byte.
	r.Add(r, big.NewRat(1, 2))
	n := new(big.Int).Quo(r.Num(), r.Denom())
	if !n.IsInt64() {
		return 0, fmt.Errorf("%w: size %q overflows", ErrBadOutput, s)
	}
	return n.Int64(), nil
}

// ParseSizeArgument reads a size a person gave (a command-line argument):
// the forms of ParseSize, but a value that is not a whole, positive number
// of bytes is an ErrInvalidArgument naming the input, never rounded ("1.5"
// is 1.5 bytes, not a disk of 1 MiB).
func ParseSizeArgument(s string) (int64, error) {
	const forms = "sizes are bytes or a number with a binary unit: 1073741824, 10G, 1536M, 1.5G"
	r, problem := parseSize(s)
	if r == nil {
		return 0, fmt.Errorf("%w: size %q %s; %s", ErrInvalidArgument, s, problem, forms)
	}
	if !r.IsInt() {
		return 0, fmt.Errorf("%w: size %q is %s bytes, not a whole number of bytes; %s", ErrInvalidArgument, s, r.FloatString(1), forms)
	}
	if r.Sign() <= 0 {
		return 0, fmt.Errorf("%w: size %q must be more than 0 bytes", ErrInvalidArgument, s)
	}
	if !r.Num().IsInt64() {
		return 0, fmt.Errorf("%w: size %q is too large", ErrInvalidArgument, s)
	}
	return r.Num().Int64(), nil
}

// parseSize reads a size into an exact number of bytes, or returns nil
// and what is wrong with it.
func parseSize(s string) (*big.Rat, string) {
	const notASize = "is not a number with an optional unit"
	s = strings.TrimSpace(s)
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.' || s[i] == ' ') {
		i++
	}
	number := strings.ReplaceAll(s[:i], " ", "")
	unit := strings.ToLower(strings.TrimSpace(s[i:]))
	mult, ok := unitMultipliers[unit]
	if number == "" || !ok || strings.Count(number, ".") > 1 || number[0] == '.' || number[len(number)-1] == '.' {
		return nil, notASize
	}
	// Thousands groups must be genuine: every group after the first has 3 digits.
	if groups := strings.Fields(s[:i]); len(groups) > 1 {
		for _, g := range groups[1:] {
			if len(g) != 3 || strings.Contains(g, ".") {
				return nil, "has malformed digit groups"
			}
		}
	}
	r, ok := new(big.Rat).SetString(number)
	if !ok {
		return nil, notASize
	}
	return r.Mul(r, new(big.Rat).SetInt64(mult)), ""
}
