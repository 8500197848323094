package rds

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Entry is one item of `print detail` output.
type Entry struct {
	Number  int    // RouterOS' entry number; -1 when the output had none
	Flags   string // flag letters printed after the number, e.g. "Bt"
	Comment string // `;;; text` comment lines, joined
	Values  map[string]string
}

var (
	entryStart = regexp.MustCompile(`^\s*([0-9]+)(\s|$)`)
	keyPattern = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	flagsWord  = regexp.MustCompile(`^[A-Za-z*]+$`)
)

// ParsePrintDetail parses `print detail` output into entries. It accepts an
// optional `Flags:` legend, numbered entries with flag letters, indented
// continuation lines, `;;;` comments, bare and quoted values, and bare values
// that continue after a space (`size=53 687 091 200`, `type=.img file`).
// Empty output is zero entries. Anything else is ErrBadOutput.
func ParsePrintDetail(out string) ([]Entry, error) {
	var (
		entries []Entry
		texts   []string // the key=value text of each entry
		current = -1
	)
	for _, raw := range strings.Split(strings.ReplaceAll(out, "\r\n", "\n"), "\n") {
		line := strings.TrimSpace(raw)
		switch {
		case line == "":
			continue
		case current < 0 && len(entries) == 0 && strings.HasPrefix(line, "Flags:"):
			continue
		case strings.HasPrefix(line, ";;;"):
			if current < 0 || texts[current] != "" {
				entries = append(entries, Entry{Number: -1, Values: map[string]string{}})
				texts = append(texts, "")
				current = len(entries) - 1
			}
			c := strings.TrimSpace(strings.TrimPrefix(line, ";;;"))
			entries[current].Comment = strings.TrimSpace(entries[current].Comment + " " + c)
			continue
		}
		if m := entryStart.FindStringSubmatch(raw); m != nil {
			n, err := strconv.Atoi(m[1])
			if err != nil {
				return nil, fmt.Errorf("%w: entry number %q", ErrBadOutput, m[1])
			}
			rest := strings.TrimSpace(raw[len(m[0]):])
			flags := ""
			if f := strings.Fields(rest); len(f) > 0 && !strings.Contains(f[0], "=") && flagsWord.MatchString(f[0]) {
				flags = f[0]
				rest = strings.TrimSpace(rest[len(f[0]):])
			}
			comment := ""
			if strings.HasPrefix(rest, ";;;") {
				comment, rest = strings.TrimSpace(rest[3:]), ""
			}
			// A comment line opens an entry before its number line.
			if current >= 0 && entries[current].Number == -1 && texts[current] == "" {
				entries[current].Number, entries[current].Flags = n, flags
				texts[current] = rest
				continue
			}
			entries = append(entries, Entry{Number: n, Flags: flags, Comment: comment, Values: map[string]string{}})
			texts = append(texts, rest)
			current = len(entries) - 1
			continue
		}
		if current < 0 {
			// Output without entry numbers (seen in single-item prints).
			if !strings.Contains(line, "=") {
				return nil, fmt.Errorf("%w: unexpected line %q", ErrBadOutput, truncate(line))
			}
			entries = append(entries, Entry{Number: -1, Values: map[string]string{}})
			texts = append(texts, line)
			current = 0
			continue
		}
		texts[current] += " " + line
	}
	for i := range entries {
		if err := parsePairs(texts[i], entries[i].Values); err != nil {
			return nil, err
		}
		if len(entries[i].Values) == 0 {
			return nil, fmt.Errorf("%w: entry %d has no properties", ErrBadOutput, entries[i].Number)
		}
	}
	return entries, nil
}

// parsePairs tokenizes `key=value key="quoted value" ...` into dst.
func parsePairs(s string, dst map[string]string) error {
	lastKey := ""
	for i := 0; i < len(s); {
		if s[i] == ' ' || s[i] == '\t' {
			i++
			continue
		}
		// Read a word up to whitespace or '='.
		j := i
		for j < len(s) && s[j] != '=' && s[j] != ' ' && s[j] != '\t' {
			j++
		}
		if j >= len(s) || s[j] != '=' {
			// A bare word continues the previous value (digit groups, "type=.img file").
			if lastKey == "" {
				return fmt.Errorf("%w: unexpected word %q", ErrBadOutput, truncate(s[i:j]))
			}
			dst[lastKey] += " " + s[i:j]
			i = j
			continue
		}
		key := s[i:j]
		if !keyPattern.MatchString(key) {
			return fmt.Errorf("%w: bad property name %q", ErrBadOutput, truncate(key))
		}
		i = j + 1
		var value string
		if i < len(s) && s[i] == '"' {
			var b strings.Builder
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				if c == '\\' && i+1 < len(s) {
					b.WriteByte(s[i+1])
					i += 2
					continue
				}
				if c == '"' {
					closed = true
					i++
					break
				}
				b.WriteByte(c)
				i++
			}
			if !closed {
				return fmt.Errorf("%w: unterminated quote in %q", ErrBadOutput, key)
			}
			value = b.String()
			lastKey = "" // a quoted value is never continued
		} else {
			k := i
			for k < len(s) && s[k] != ' ' && s[k] != '\t' {
				k++
			}
			value = s[i:k]
			i = k
			lastKey = key
		}
		dst[key] = value
	}
	return nil
}

// ParseResource parses `/system resource print` (`key: value` lines).
func ParseResource(out string) (map[string]string, error) {
	res := map[string]string{}
	for _, raw := range strings.Split(out, "\n") {
		line := strings.TrimSpace(raw)
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		k = strings.TrimSpace(k)
		if !ok || !keyPattern.MatchString(k) {
			return nil, fmt.Errorf("%w: unexpected resource line %q", ErrBadOutput, truncate(line))
		}
		res[k] = strings.TrimSpace(v)
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("%w: empty resource output", ErrBadOutput)
	}
	return res, nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
