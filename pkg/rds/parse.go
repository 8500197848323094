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
	Flags   string // the flag letters set, blanks left out: "Bt" for `B t`
	Comment string // `;;; text` comment lines, joined
	Values  map[string]string
}

// Listing is `print detail` output read entry by entry: the entries
// understood, and the ones that were not, each with its reason. One entry
// the parser cannot read (a disk of a kind it does not know, a flag
// column it cannot place) never hides the others.
type Listing struct {
	Entries []Entry
	Skipped []SkippedEntry
}

// SkippedEntry is an entry of a listing that could not be read.
type SkippedEntry struct {
	Number int    // its entry number; -1 when it had none
	Text   string // its lines as printed
	Err    error  // why it was skipped; wraps ErrBadOutput
}

var (
	entryStart = regexp.MustCompile(`^\s*([0-9]+)(\s|$)`)
	keyPattern = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	// flagsWord is a run of flag letters where no legend names them.
	flagsWord = regexp.MustCompile(`^[A-Za-z*+]+$`)
)

// ParsePrintDetail parses `print detail` output into entries and fails
// on the first entry it cannot read (ParseListing reads the others).
func ParsePrintDetail(out string) ([]Entry, error) {
	l, err := ParseListing(out)
	if err != nil {
		return nil, err
	}
	return l.strict()
}

// strict is the listing's entries, or the error of the first one it could
// not read, for reads that must see every entry.
func (l Listing) strict() ([]Entry, error) {
	if len(l.Skipped) > 0 {
		return nil, fmt.Errorf("%w (entry %d of the output)", l.Skipped[0].Err, l.Skipped[0].Number)
	}
	return l.Entries, nil
}

// ParseListing parses `print detail` output. It accepts a `Flags:` legend
// (also one that runs onto more lines), numbered entries whose flags stand
// in the legend's columns (one column per `;`-separated group of the
// legend, a blank for a flag not set: `27 B r`, `26 BM `, `31 B t`),
// indented continuation lines, `;;;` comments, bare and quoted values,
// bare values that continue after a space (`size=53 687 091 200`,
// `type=.img file`), CRLF line ends, separator lines holding blanks, and
// values that RouterOS broke across lines at any column (see lineBreak).
// Empty output is zero entries. An entry it cannot read is put in
// Skipped; output that is not a listing at all is ErrBadOutput. It runs in
// time linear in the length of the output.
func ParseListing(out string) (Listing, error) {
	var (
		entries  []Entry
		scanners []*pairScanner
		comments [][]string
		texts    []*strings.Builder
		errs     []error
		cur      = -1
		propCol  = 0 // column of the current entry's first property
		numCol   = 0 // column right after the entry numbers (right-aligned)
		legend   strings.Builder
		inLegend = false
		columns  []string // the legend's flag columns, once read
		colsRead = false
	)
	newEntry := func(n int, flags string) {
		entries = append(entries, Entry{Number: n, Flags: flags, Values: map[string]string{}})
		scanners = append(scanners, &pairScanner{dst: entries[len(entries)-1].Values})
		comments = append(comments, nil)
		texts = append(texts, &strings.Builder{})
		errs = append(errs, nil)
		cur = len(entries) - 1
	}
	// fail marks the current entry unreadable; the rest of its lines are
	// kept for the record and not scanned.
	fail := func(err error) {
		if errs[cur] == nil {
			errs[cur] = err
		}
	}
	feed := func(text string, continued bool) {
		if errs[cur] == nil {
			if err := scanners[cur].feed(text, continued); err != nil {
				fail(err)
			}
		}
	}
	for len(out) > 0 {
		var raw string
		if i := strings.IndexByte(out, '\n'); i >= 0 {
			raw, out = out[:i], out[i+1:]
		} else {
			raw, out = out, ""
		}
		raw = strings.TrimRight(strings.TrimSuffix(raw, "\r"), " \t")
		line := strings.TrimLeft(raw, " \t")
		indent := len(raw) - len(line)
		switch {
		case line == "":
			continue
		case cur < 0 && strings.HasPrefix(line, "Flags:"):
			inLegend = true
			legend.WriteString(strings.TrimPrefix(line, "Flags:"))
			continue
		case inLegend && cur < 0 && !strings.Contains(line, "=") && !entryStart.MatchString(raw) && !strings.HasPrefix(line, ";;;"):
			// The legend ran onto another line.
			legend.WriteByte(' ')
			legend.WriteString(line)
			continue
		}
		if !colsRead {
			columns, colsRead = legendColumns(legend.String()), true
		}
		if strings.HasPrefix(line, ";;;") {
			if cur < 0 || !scanners[cur].empty() || errs[cur] != nil {
				newEntry(-1, "")
				propCol = 0
			}
			texts[cur].WriteString(raw + "\n")
			comments[cur] = append(comments[cur], strings.TrimSpace(line[3:]))
			continue
		}
		// A number line opens an entry; a line indented to the property
		// column is a continuation even when it starts with digits (the
		// rest of a wrapped `size=10 737 41` / `8 240`).
		// Entry numbers are right-aligned to one column (`  9`, `100`): a
		// digit line indented to or past it continues a value, whatever
		// the property column (RouterOS may indent a continuation less
		// than it after a 3-digit number).
		if m := entryStart.FindStringSubmatch(raw); m != nil && (cur < 0 || indent < propCol || propCol == 0) && (numCol == 0 || indent < numCol) {
			numEnd := strings.Index(raw, m[1]) + len(m[1])
			if numCol == 0 || numEnd > numCol {
				numCol = numEnd
			}
			n, nerr := strconv.Atoi(m[1])
			if nerr != nil {
				n = -1
			}
			flags, rest, ferr := readFlags(raw[numEnd:], columns)
			if cur >= 0 && entries[cur].Number == -1 && scanners[cur].empty() && errs[cur] == nil && len(comments[cur]) > 0 {
				// A comment line opened this entry before its number line.
				entries[cur].Number, entries[cur].Flags = n, flags
			} else {
				newEntry(n, flags)
			}
			texts[cur].WriteString(raw + "\n")
			switch {
			case nerr != nil:
				fail(fmt.Errorf("%w: entry number %q", ErrBadOutput, truncate(m[1])))
			case ferr != nil:
				fail(fmt.Errorf("%w: entry %d: %v", ErrBadOutput, n, ferr))
			}
			if strings.HasPrefix(rest, ";;;") {
				comments[cur] = append(comments[cur], strings.TrimSpace(rest[3:]))
				rest = ""
			}
			propCol = len(raw) - len(rest)
			if rest == "" {
				propCol = len(raw) + 1
			}
			feed(rest, false)
			continue
		}
		if cur < 0 {
			// Output without entry numbers (seen in single-item prints).
			if !strings.Contains(line, "=") {
				return Listing{}, fmt.Errorf("%w: unexpected line %q", ErrBadOutput, truncate(line))
			}
			newEntry(-1, "")
			propCol = indent + 1
			texts[cur].WriteString(raw + "\n")
			feed(line, false)
			continue
		}
		texts[cur].WriteString(raw + "\n")
		feed(line, !scanners[cur].empty())
	}
	var l Listing
	for i := range entries {
		err := errs[i]
		if err == nil {
			err = scanners[i].finish()
		}
		if err == nil && len(entries[i].Values) == 0 {
			err = fmt.Errorf("%w: entry %d has no properties", ErrBadOutput, entries[i].Number)
		}
		if err != nil {
			l.Skipped = append(l.Skipped, SkippedEntry{Number: entries[i].Number, Text: texts[i].String(), Err: err})
			continue
		}
		entries[i].Comment = strings.Join(comments[i], " ")
		l.Entries = append(l.Entries, entries[i])
	}
	return l, nil
}

// legendColumns reads the flag columns of a `Flags:` legend (the text
// after "Flags:", its lines joined): one column per group between
// semicolons, each holding the letters of its comma-separated flags
// (`X - DISABLED; A - ACQUIRED, E - EMPTY, B - BLOCK-DEVICE; M - MOUNTED`
// is three columns: X, AEB, M). nil when there is no legend or a part of
// it is not `letter - NAME`.
func legendColumns(text string) []string {
	var cols []string
	for _, group := range strings.Split(text, ";") {
		if strings.TrimSpace(group) == "" {
			continue
		}
		letters := ""
		for _, part := range strings.Split(group, ",") {
			letter, _, _ := strings.Cut(strings.TrimSpace(part), " - ")
			letter = strings.TrimSpace(letter)
			if len(letter) != 1 || letter[0] <= ' ' || letter[0] > '~' || letter == "=" || letter == `"` {
				return nil
			}
			letters += letter
		}
		cols = append(cols, letters)
	}
	return cols
}

// readFlags reads the flags after an entry's number (s starts right after
// the digits) and returns the letters set and the rest of the line. The
// flags are read by column against the legend: one space after the
// number, then one character per column, a blank or one of that column's
// letters. Where that does not fit (a legend the parser could not read,
// numbers padded another way), the words before the first property are
// taken as flags, each letter one the legend names (any letter when there
// is no legend).
func readFlags(s string, columns []string) (flags, rest string, err error) {
	if n := len(columns); n > 0 && strings.HasPrefix(s, " ") {
		field, tail := s[1:], ""
		if len(field) > n {
			field, tail = field[:n], field[n:]
		}
		if tail == "" || tail[0] == ' ' {
			var b strings.Builder
			ok := true
			for i := 0; i < len(field) && ok; i++ {
				switch c := field[i]; {
				case c == ' ':
				case strings.IndexByte(columns[i], c) >= 0:
					b.WriteByte(c)
				default:
					ok = false
				}
			}
			if ok {
				return b.String(), strings.TrimLeft(tail, " \t"), nil
			}
		}
	}
	rest = strings.TrimLeft(s, " \t")
	for rest != "" {
		w, after, _ := strings.Cut(rest, " ")
		if strings.Contains(w, "=") || strings.HasPrefix(w, ";;;") {
			break
		}
		if len(columns) == 0 {
			if !flagsWord.MatchString(w) {
				break // not flags: the property scanner judges it
			}
		} else {
			for i := 0; i < len(w); i++ {
				if !inColumns(columns, w[i]) {
					return "", "", fmt.Errorf("flag %q is not in the Flags legend", truncate(w))
				}
			}
		}
		flags += w
		rest = strings.TrimLeft(after, " \t")
	}
	return flags, rest, nil
}

func inColumns(columns []string, c byte) bool {
	for _, col := range columns {
		if strings.IndexByte(col, c) >= 0 {
			return true
		}
	}
	return false
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

// feed scans one line. continued reports that the line continues the
// entry's text after a line break.
func (p *pairScanner) feed(line string, continued bool) error {
	if line == "" {
		return nil
	}
	p.fed = true
	if continued {
		if err := p.lineBreak(line); err != nil {
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
// read, by what can continue it, never by the length of the line: RouterOS
// breaks lines at the terminal width, and also well short of it (a
// file-path broken before a '-' in the middle of a UUID). A `key=` starts
// a property; inside quotes or right after '=' the pieces are joined; a
// word without '=' that cannot continue the open value is a key broken in
// the middle; otherwise joinFragment decides.
func (p *pairScanner) lineBreak(next string) error {
	first, _, _ := strings.Cut(next, " ")
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
// first word of the next line: "" joins the pieces (the driver's IDs,
// paths and NQNs never contain spaces, wherever RouterOS broke them), " "
// when the break fell on a space inside one of the values RouterOS prints
// with spaces (digit groups, `type=.img file`, a date and time).
func joinFragment(key, sofar string, digitsOnly, spaced bool, group int, next string) string {
	if digitsOnly && sofar != "" && allDigits(next) && (spaced || groupedKeys[key]) {
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

// groupedKeys are the properties whose numbers RouterOS prints in digit
// groups (`size=53 687 091 200`, and the I/O counters of health.go, as
// monitor-traffic prints them: `read-bytes: 33 131 503 616`); other
// numbers (a port, an offset) are printed whole, so a break inside one
// never fell on a space.
var groupedKeys = map[string]bool{"size": true, "free": true,
	"read-ops": true, "write-ops": true, "read-bytes": true, "write-bytes": true, "io-errors": true,
	"read-ops-per-second": true, "write-ops-per-second": true, "unsafe-shutdowns": true}

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

// truncate is a piece of RouterOS output as an error may quote it: cut
// to 40 bytes, and withheld whole where it shows a trace of an export's
// password or secret (holdsSecret), which an error would carry to the
// CO, events and logs.
func truncate(s string) string {
	if holdsSecret(s) {
		return "(withheld: it holds an export's password or secret)"
	}
	return truncateTo(s, 40)
}

// truncateTo keeps s to n bytes, marking a cut.
func truncateTo(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
