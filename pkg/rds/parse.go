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

// ParsePrintDetail parses `print detail` output into entries. It accepts a
// `Flags:` legend (also one that runs onto more lines), numbered entries
// with flag letters, indented continuation lines, `;;;` comments, bare and
// quoted values, bare values that continue after a space
// (`size=53 687 091 200`, `type=.img file`), CRLF line ends, and values that
// the terminal width broke across lines at any column (see joinFragment).
// Empty output is zero entries. Anything else is ErrBadOutput. It runs in
// time linear in the length of the output.
func ParsePrintDetail(out string) ([]Entry, error) {
	var (
		entries  []Entry
		scanners []*pairScanner
		comments [][]string
		cur      = -1
		propCol  = 0 // column of the current entry's first property
		legend   = false
		// The longest line: a line this long may have been broken at the
		// terminal width; a shorter one ended where RouterOS ended it.
		width    = longestLine(out)
		prevFull = false
	)
	newEntry := func(n int, flags string) {
		entries = append(entries, Entry{Number: n, Flags: flags, Values: map[string]string{}})
		scanners = append(scanners, &pairScanner{dst: entries[len(entries)-1].Values})
		comments = append(comments, nil)
		cur = len(entries) - 1
	}
	for len(out) > 0 {
		var raw string
		if i := strings.IndexByte(out, '\n'); i >= 0 {
			raw, out = out[:i], out[i+1:]
		} else {
			raw, out = out, ""
		}
		raw = strings.TrimSuffix(raw, "\r")
		full := len(raw) >= width
		raw = strings.TrimRight(raw, " \t")
		line := strings.TrimLeft(raw, " \t")
		indent := len(raw) - len(line)
		switch {
		case line == "":
			continue
		case cur < 0 && strings.HasPrefix(line, "Flags:"):
			legend = true
			continue
		case legend && cur < 0 && !strings.Contains(line, "=") && !entryStart.MatchString(raw):
			continue // the legend ran onto another line
		case strings.HasPrefix(line, ";;;"):
			if cur < 0 || !scanners[cur].empty() {
				newEntry(-1, "")
				propCol = 0
			}
			comments[cur] = append(comments[cur], strings.TrimSpace(line[3:]))
			continue
		}
		// A number line opens an entry; a line indented to the property
		// column is a continuation even when it starts with digits (the
		// rest of a wrapped `size=10 737 41` / `8 240`).
		if m := entryStart.FindStringSubmatch(raw); m != nil && (cur < 0 || indent < propCol || propCol == 0) {
			n, err := strconv.Atoi(m[1])
			if err != nil {
				return nil, fmt.Errorf("%w: entry number %q", ErrBadOutput, m[1])
			}
			rest := strings.TrimLeft(raw[len(m[0]):], " \t")
			flags := ""
			if f, _, _ := strings.Cut(rest, " "); f != "" && flagsWord.MatchString(f) {
				flags = f
				rest = strings.TrimLeft(rest[len(f):], " \t")
			}
			if strings.HasPrefix(rest, ";;;") {
				if cur >= 0 && entries[cur].Number == -1 && scanners[cur].empty() {
					entries[cur].Number, entries[cur].Flags = n, flags
				} else {
					newEntry(n, flags)
				}
				comments[cur] = append(comments[cur], strings.TrimSpace(rest[3:]))
				rest = ""
			} else if cur >= 0 && entries[cur].Number == -1 && scanners[cur].empty() {
				// A comment line opened this entry before its number line.
				entries[cur].Number, entries[cur].Flags = n, flags
			} else {
				newEntry(n, flags)
			}
			propCol = len(raw) - len(rest)
			if rest == "" {
				propCol = len(raw) + 1
			}
			if err := scanners[cur].feed(rest, false, false); err != nil {
				return nil, err
			}
			prevFull = full
			continue
		}
		if cur < 0 {
			// Output without entry numbers (seen in single-item prints).
			if !strings.Contains(line, "=") {
				return nil, fmt.Errorf("%w: unexpected line %q", ErrBadOutput, truncate(line))
			}
			newEntry(-1, "")
			propCol = indent + 1
			if err := scanners[cur].feed(line, false, false); err != nil {
				return nil, err
			}
			prevFull = full
			continue
		}
		if err := scanners[cur].feed(line, !scanners[cur].empty(), prevFull); err != nil {
			return nil, err
		}
		prevFull = full
	}
	for i := range entries {
		if err := scanners[i].finish(); err != nil {
			return nil, err
		}
		entries[i].Comment = strings.Join(comments[i], " ")
		if len(entries[i].Values) == 0 {
			return nil, fmt.Errorf("%w: entry %d has no properties", ErrBadOutput, entries[i].Number)
		}
	}
	return entries, nil
}

// scanState is where a pairScanner is within `key=value key="v" ...`.
type scanState int

const (
	between  scanState = iota // between tokens
	inWord                    // a word: a key until '=' comes, else a continuation word
	afterEq                   // right after '='
	inBare                    // a bare value
	inQuoted                  // a quoted value
	inEscape                  // after a backslash in a quoted value
)

// pairScanner tokenizes the key=value text of one entry, line by line, in a
// single pass. A line break inside a token is resolved where it happens:
// inside quotes or right after '=' the pieces are joined; before a
// `key=` they are separate properties; otherwise joinFragment decides.
type pairScanner struct {
	dst   map[string]string
	state scanState
	word  strings.Builder // the word being read in inWord
	key   string          // the key of the value being read or still open
	val   strings.Builder // that value
	open  bool            // a bare value that a following word may continue
	// For joinFragment: the open value is digit groups so far, the length
	// of its last word, and whether it has a space already.
	digitsOnly bool
	group      int
	spaced     bool
	fed        bool
}

func (p *pairScanner) empty() bool { return !p.fed }

// feed scans one line. continued reports that the line is a continuation
// of the entry (a line break precedes it); afterFull, that the line before
// it was as long as the longest line, so the break may be the terminal's.
func (p *pairScanner) feed(line string, continued, afterFull bool) error {
	if line == "" {
		return nil
	}
	p.fed = true
	if continued {
		if err := p.lineBreak(line, afterFull); err != nil {
			return err
		}
	}
	for i := 0; i < len(line); i++ {
		if err := p.char(line[i]); err != nil {
			return err
		}
	}
	return nil
}

// lineBreak decides what the break before next means for the token being
// read.
func (p *pairScanner) lineBreak(next string, afterFull bool) error {
	first, _, _ := strings.Cut(next, " ")
	if !afterFull && (p.state == inWord || p.state == inBare) {
		// A shorter line ended where RouterOS ended it, or at a space.
		return p.char(' ')
	}
	startsProperty := false
	if k, _, ok := strings.Cut(first, "="); ok && keyPattern.MatchString(k) {
		startsProperty = true
	}
	switch p.state {
	case inQuoted, inEscape:
		return nil // a quoted value goes on
	case afterEq:
		if startsProperty {
			return p.char(' ') // an empty bare value
		}
		return nil // the value starts on the next line
	case inWord:
		w := p.word.String()
		if strings.HasPrefix(next, "=") || !p.open || !p.continues(w) {
			return nil // a key broken in the middle or before its '='
		}
		// The word continues the open value, e.g. `size=10 737` / `418 240`.
		p.continueValue(w)
		p.word.Reset()
		p.state = inBare
		fallthrough
	case inBare:
		if startsProperty {
			return p.char(' ')
		}
		if sep := joinFragment(p.key, p.val.String(), p.digitsOnly, p.spaced, p.group, first); sep != "" {
			return p.char(' ')
		}
	}
	return nil
}

// joinFragment decides how a value broken at a line end continues with the
// first word of the next line: "" joins the pieces (a value broken at the
// terminal width: the driver's IDs, paths and NQNs never contain spaces),
// " " when the break fell on a space inside one of the values RouterOS
// prints with spaces (digit groups, `type=.img file`, a date and time).
func joinFragment(key, sofar string, digitsOnly, spaced bool, group int, next string) string {
	if digitsOnly && sofar != "" && allDigits(next) {
		// Exactly one of the two readings gives genuine thousands groups:
		// every group but the first has three digits, the first 1-3.
		firstGroup := !spaced
		joined := group + len(next)
		if joined == 3 || (firstGroup && joined <= 3) {
			return ""
		}
		if group == 3 || firstGroup {
			return " "
		}
		return ""
	}
	switch {
	case key == "type" && strings.HasPrefix(sofar, ".") && !spaced && strings.HasPrefix(next, "file"):
		return " "
	case !spaced && len(sofar) == len("2006-01-02") && sofar[4] == '-' && sofar[7] == '-' && len(next) > 2 && next[2] == ':':
		return " "
	}
	return ""
}

// longestLine is the length of the longest line of out, without its CR.
func longestLine(out string) int {
	longest := 0
	for len(out) > 0 {
		line := out
		if i := strings.IndexByte(out, '\n'); i >= 0 {
			line, out = out[:i], out[i+1:]
		} else {
			out = ""
		}
		longest = max(longest, len(strings.TrimSuffix(line, "\r")))
	}
	return longest
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// continues reports whether a word at a line end, after the open bare
// value and a space, is more of that value (a digit group, the `file` of
// `type=.img file`, the time of a date) rather than the first part of a
// key that the terminal width broke (`... compress=no sec` / `tor-size=512`).
func (p *pairScanner) continues(w string) bool {
	switch {
	case p.digitsOnly && allDigits(w):
		return true
	case p.key == "type" && !p.spaced && strings.HasPrefix(p.val.String(), ".") && strings.HasPrefix("file", w):
		return true
	case p.spaced:
		return false
	}
	return joinFragment(p.key, p.val.String(), false, false, 0, w) == " "
}

// continueValue appends a word that follows the open bare value after a
// space (`size=53 687`, `type=.img file`).
func (p *pairScanner) continueValue(w string) {
	p.val.WriteByte(' ')
	p.val.WriteString(w)
	p.digitsOnly = p.digitsOnly && allDigits(w)
	p.group = len(w)
	p.spaced = true
}

func (p *pairScanner) closeValue() {
	if p.open {
		p.dst[p.key] = p.val.String()
		p.open = false
	}
}

func (p *pairScanner) char(c byte) error {
	switch p.state {
	case between:
		switch c {
		case ' ', '\t':
		case '=':
			return fmt.Errorf("%w: '=' without a property name", ErrBadOutput)
		default:
			p.word.WriteByte(c)
			p.state = inWord
		}
	case inWord:
		switch c {
		case '=':
			key := p.word.String()
			p.word.Reset()
			if !keyPattern.MatchString(key) {
				return fmt.Errorf("%w: bad property name %q", ErrBadOutput, truncate(key))
			}
			p.closeValue()
			p.key = key
			p.val.Reset()
			p.state = afterEq
		case ' ', '\t':
			if !p.open {
				return fmt.Errorf("%w: unexpected word %q", ErrBadOutput, truncate(p.word.String()))
			}
			p.continueValue(p.word.String())
			p.word.Reset()
			p.state = between
		default:
			p.word.WriteByte(c)
		}
	case afterEq:
		switch c {
		case '"':
			p.state = inQuoted
		case ' ', '\t':
			p.dst[p.key] = ""
			p.open, p.digitsOnly, p.group, p.spaced = true, false, 0, false
			p.val.Reset()
			p.state = between
		default:
			p.val.WriteByte(c)
			p.open, p.digitsOnly, p.group, p.spaced = true, c >= '0' && c <= '9', 1, false
			p.state = inBare
		}
	case inBare:
		switch c {
		case ' ', '\t':
			p.state = between
		default:
			p.val.WriteByte(c)
			p.digitsOnly = p.digitsOnly && c >= '0' && c <= '9'
			p.group++
		}
	case inQuoted:
		switch c {
		case '\\':
			p.state = inEscape
		case '"':
			p.dst[p.key] = p.val.String()
			p.open = false // a quoted value is never continued
			p.state = between
		default:
			p.val.WriteByte(c)
		}
	case inEscape:
		p.val.WriteByte(c)
		p.state = inQuoted
	}
	return nil
}

// finish ends the entry's text.
func (p *pairScanner) finish() error {
	switch p.state {
	case inQuoted, inEscape:
		return fmt.Errorf("%w: unterminated quote in %q", ErrBadOutput, p.key)
	case inWord:
		if !p.open {
			return fmt.Errorf("%w: unexpected word %q", ErrBadOutput, truncate(p.word.String()))
		}
		p.continueValue(p.word.String())
	case afterEq:
		p.dst[p.key] = ""
	}
	p.closeValue()
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
