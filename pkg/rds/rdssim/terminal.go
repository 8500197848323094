package rdssim

import (
	"strconv"
	"strings"
)

// DefaultTerminalWidth is where the simulator wraps print output unless the
// login name asks for another width: about what ROSE hardware was seen to
// use over SSH.
const DefaultTerminalWidth = 80

// loginOptions splits a RouterOS login name into the user name and the
// console options after '+' (MikroTik's "console login options": e.g.
// "admin+ct511w4098h" is user admin, no colours, no terminal detection,
// 511 columns, 4098 rows). width is 0 when the name sets none. A name whose
// options do not parse is taken whole, as a user name.
func loginOptions(login string) (user string, width int) {
	user, opts, ok := strings.Cut(login, "+")
	if !ok {
		return login, 0
	}
	num := ""
	for i := 0; i < len(opts); i++ {
		switch c := opts[i]; {
		case c >= '0' && c <= '9':
			num += string(c)
		case c >= 'a' && c <= 'z':
			if c == 'w' && num != "" {
				n, err := strconv.Atoi(num)
				if err != nil || n <= 0 {
					return login, 0
				}
				width = n
			}
			num = ""
		default:
			return login, 0
		}
	}
	if num != "" {
		return login, 0 // a number without its letter
	}
	return user, width
}

// wrapWords lays out space-separated words from the first one on, as
// RouterOS prints the properties of an item: a word that does not fit on
// the current line moves to the next one, indented by indent; a word longer
// than a whole line is broken at exactly width columns, the rest continuing
// on the next lines, or, with beforeHyphen, before the last '-' of its
// value that fits (as RDS hardware broke a file-path short of the width,
// the rest starting with the '-'; ValueBreakHyphen). width <= 0 means no
// limit. first is the start of the first line (e.g. " 0 Bt ").
func wrapWords(b *strings.Builder, first string, words []string, indent, width int, beforeHyphen bool) {
	pad := strings.Repeat(" ", indent)
	line := first
	empty := true
	for _, w := range words {
		if !empty {
			if width > 0 && len(line)+1+len(w) > width {
				b.WriteString(line)
				b.WriteByte('\n')
				line, empty = pad, true
			} else {
				line += " "
			}
		}
		// Where the word's value starts on this line: a break goes after
		// it, never into the key.
		valueAt := len(line) + strings.IndexByte(w, '=') + 1
		line += w
		empty = false
		for width > 0 && len(line) > width && width > indent {
			cut := width
			if beforeHyphen {
				from := max(valueAt+1, indent+1)
				if from < width {
					if i := strings.LastIndexByte(line[from:width], '-'); i >= 0 {
						cut = from + i
					}
				}
			}
			b.WriteString(line[:cut])
			b.WriteByte('\n')
			line = pad + line[cut:]
			valueAt = indent
		}
	}
	b.WriteString(line)
	b.WriteByte('\n')
}
