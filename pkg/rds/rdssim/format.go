package rdssim

import (
	"fmt"
	"strconv"
	"strings"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
	tib = int64(1) << 40
)

// ParseSize parses a RouterOS size argument: a bare byte count, or a number
// with a binary suffix k/K, M, G or T. Nothing is rounded.
func ParseSize(s string) (int64, error) {
	if s == "" {
		return 0, fmt.Errorf("empty size")
	}
	mult := int64(1)
	switch s[len(s)-1] {
	case 'k', 'K':
		mult = kib
	case 'M':
		mult = mib
	case 'G':
		mult = gib
	case 'T':
		mult = tib
	}
	digits := s
	if mult != 1 {
		digits = s[:len(s)-1]
	}
	if digits == "" {
		return 0, fmt.Errorf("size %q has no number", s)
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("size %q is not a whole number with an optional k/K/M/G/T suffix", s)
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	if n > (1<<63-1)/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return n * mult, nil
}

// spacedNumber prints n the way RouterOS prints exact byte counts:
// digit groups of three separated by single spaces ("53 687 091 200").
func spacedNumber(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(' ')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// humanSize prints n the way RouterOS prints file-size=: one decimal and a
// KiB/MiB/GiB unit (1 TiB is "1024.0GiB"), bare bytes below 1 KiB.
func humanSize(n int64) string {
	switch {
	case n >= gib:
		return fmt.Sprintf("%.1fGiB", float64(n)/float64(gib))
	case n >= mib:
		return fmt.Sprintf("%.1fMiB", float64(n)/float64(mib))
	case n >= kib:
		return fmt.Sprintf("%.1fKiB", float64(n)/float64(kib))
	default:
		return strconv.FormatInt(n, 10)
	}
}

// prop is one key=value pair of a printed item. raw is the plain value used
// by where/find conditions; text is how it is printed.
type prop struct {
	key  string
	raw  string
	text string
}

// strProp is a string-typed property: always printed double-quoted.
func strProp(key, v string) prop { return prop{key: key, raw: v, text: quote(v)} }

// bareProp is printed bare unless it needs quoting.
func bareProp(key, v string) prop {
	if v == "" || !isBareValue(v) {
		return prop{key: key, raw: v, text: quote(v)}
	}
	return prop{key: key, raw: v, text: v}
}

// rawProp is printed exactly as given (e.g. "type=.img file").
func rawProp(key, v string) prop { return prop{key: key, raw: v, text: v} }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func isBareValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if !isBareChar(v[i]) {
			return false
		}
	}
	return true
}

// quote prints v double-quoted with RouterOS backslash escapes.
func quote(v string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '"', '\\', '$':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// item is one numbered entry of a print detail listing.
type item struct {
	flags string
	props []prop
}

// formatDetail renders items in the RouterOS `print detail` form for a
// terminal width columns wide (<= 0: no limit): the Flags legend, even when
// nothing matched, wrapped after its `;` separators; numbered entries with
// flag letters; properties wrapped between them, a property longer than a
// line broken in the middle of its value; continuation lines indented under
// the first property; a blank line between entries. No items and no legend
// prints nothing at all.
func formatDetail(legend string, items []item, width int) string {
	var b strings.Builder
	if legend != "" {
		const prefix = "Flags: "
		wrapWords(&b, prefix, splitLegend(legend), len(prefix), width)
	}
	if len(items) == 0 {
		return b.String()
	}
	numWidth := len(strconv.Itoa(len(items) - 1))
	if numWidth < 2 {
		numWidth = 2
	}
	// The flag column is at least two letters wide whatever is printed,
	// so entries line up ("Bt" and "B ").
	flagWidth := 0
	if legend != "" {
		flagWidth = 2
	}
	for _, it := range items {
		flagWidth = max(flagWidth, len(it.flags))
	}
	for i, it := range items {
		if i > 0 {
			b.WriteByte('\n')
		}
		prefix := fmt.Sprintf("%*d ", numWidth, i)
		if flagWidth > 0 {
			prefix += fmt.Sprintf("%-*s ", flagWidth, it.flags)
		}
		words := make([]string, len(it.props))
		for j, p := range it.props {
			words[j] = p.key + "=" + p.text
		}
		wrapWords(&b, prefix, words, len(prefix), width)
	}
	return b.String()
}

// splitLegend splits "B - BLOCK-DEVICE; M - MOUNTED" into the pieces a
// line may break after: "B - BLOCK-DEVICE;", "M - MOUNTED".
func splitLegend(legend string) []string {
	parts := strings.SplitAfter(legend, "; ")
	for i := range parts {
		parts[i] = strings.TrimSuffix(parts[i], " ")
	}
	return parts
}

// formatResource renders `key: value` lines with right-aligned keys, the
// form of `/system resource print`.
func formatResource(props [][2]string) string {
	var b strings.Builder
	for _, kv := range props {
		fmt.Fprintf(&b, "%25s: %s\n", kv[0], kv[1])
	}
	return b.String()
}
