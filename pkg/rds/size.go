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
// RouterOS, so they are converted to the nearest byte.
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.' || s[i] == ' ') {
		i++
	}
	number := strings.ReplaceAll(s[:i], " ", "")
	unit := strings.ToLower(strings.TrimSpace(s[i:]))
	mult, ok := unitMultipliers[unit]
	if number == "" || !ok || strings.Count(number, ".") > 1 || number[0] == '.' || number[len(number)-1] == '.' {
		return 0, fmt.Errorf("%w: size %q", ErrBadOutput, s)
	}
	// Thousands groups must be genuine: every group after the first has 3 digits.
	if groups := strings.Fields(s[:i]); len(groups) > 1 {
		for _, g := range groups[1:] {
			if len(g) != 3 || strings.Contains(g, ".") {
				return 0, fmt.Errorf("%w: size %q has malformed digit groups", ErrBadOutput, s)
			}
		}
	}
	r, ok := new(big.Rat).SetString(number)
	if !ok {
		return 0, fmt.Errorf("%w: size %q", ErrBadOutput, s)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	// Round half up to the nearest byte.
	r.Add(r, big.NewRat(1, 2))
	n := new(big.Int).Quo(r.Num(), r.Denom())
	if !n.IsInt64() {
		return 0, fmt.Errorf("%w: size %q overflows", ErrBadOutput, s)
	}
	return n.Int64(), nil
}
