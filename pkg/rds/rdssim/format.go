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
// by where/find conditions; text is how it is printed. A hidden property
// is not printed, and where/find conditions still see it (as RouterOS
// evaluates a condition on the property, not on the printed text).
type prop struct {
	key    string
	raw    string
	text   string
	hidden bool
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

// item is one numbered entry of a print detail listing: the letters of
// its flags that are set, and its properties.
type item struct {
	flags string
	props []prop
}

// layout is how print output is laid out: the terminal width (<= 0: no
// limit), a long value broken before a '-' (Config.ValueBreak hyphen),
// and a legend naming every flag of the menu rather than only those the
// listing uses (Config.Legend all).
type layout struct {
	width        int
	beforeHyphen bool
	legendAll    bool
}

// flagColumn is one column of a Flags legend.
type flagColumn struct {
	letter byte
	name   string
}

// formatDetail renders items in the RouterOS `print detail` form for a
// terminal width columns wide (<= 0: no limit), as RDS hardware printed
// it: the Flags legend, naming the flags of columns that the printed items
// set (all of them when nothing matched, when the legend is printed alone,
// and with lay.legendAll),
// wrapped after its `;` separators; numbered entries, the number
// right-aligned, then one character per legend column, the flag's letter
// or a blank (`26 BM `, `27 B r`, ` 1 B t`); properties wrapped between
// them, a property longer than a line broken in the middle of its value;
// continuation lines indented under the first property; a blank line
// between entries. Without columns there is no legend and no flag field.
// No items and no legend prints nothing at all.
func formatDetail(columns []flagColumn, items []item, lay layout) string {
	var b strings.Builder
	width := lay.width
	used := columns
	if len(items) > 0 && !lay.legendAll {
		used = nil
		for _, c := range columns {
			for _, it := range items {
				if strings.IndexByte(it.flags, c.letter) >= 0 {
					used = append(used, c)
					break
				}
			}
		}
	}
	if len(used) > 0 {
		const prefix = "Flags: "
		names := make([]string, len(used))
		for i, c := range used {
			names[i] = string(c.letter) + " - " + c.name
		}
		wrapWords(&b, prefix, splitLegend(strings.Join(names, "; ")), len(prefix), width, false)
	}
	if len(items) == 0 {
		return b.String()
	}
	numWidth := max(len(strconv.Itoa(len(items)-1)), 2)
	for i, it := range items {
		if i > 0 {
			b.WriteByte('\n')
		}
		prefix := fmt.Sprintf("%*d ", numWidth, i)
		if len(used) > 0 {
			field := make([]byte, len(used))
			for j, c := range used {
				field[j] = ' '
				if strings.IndexByte(it.flags, c.letter) >= 0 {
					field[j] = c.letter
				}
			}
			prefix += string(field) + " "
		}
		words := make([]string, 0, len(it.props))
		for _, p := range it.props {
			if !p.hidden {
				words = append(words, p.key+"="+p.text)
			}
		}
		wrapWords(&b, prefix, words, len(prefix), width, lay.beforeHyphen)
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
