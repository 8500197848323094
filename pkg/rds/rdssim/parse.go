package rdssim

import (
	"fmt"
	"regexp"
	"strings"
)

// cliError is a RouterOS error message: it is the whole output of the
// command, printed as text (RouterOS does not report errors by exit status).
type cliError string

func (e cliError) Error() string { return string(e) }

// Columns are 1-based; pos arguments are 0-based byte offsets into the line.
func syntaxError(pos int) cliError {
	return cliError(fmt.Sprintf("syntax error (line 1 column %d)", pos+1))
}

func expectedEnd(pos int) cliError {
	return cliError(fmt.Sprintf("expected end of command (line 1 column %d)", pos+1))
}

func badCommandName(name string, pos int) cliError {
	return cliError(fmt.Sprintf("bad command name %s (line 1 column %d)", name, pos+1))
}

func invalidValue(arg string) cliError {
	return cliError("invalid value for argument " + arg)
}

func noMatchingValue(arg string) cliError {
	return cliError("input does not match any value of " + arg)
}

func failure(msg string) cliError { return cliError("failure: " + msg) }

// isBareChar reports whether c may appear in an unquoted word or value.
// Everything else outside quotes is a syntax error; in particular `$`
// (variables), `;` (command separator), backticks, brackets other than the
// `[find ...]` form, and control characters.
func isBareChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '-', '_', '.', ':', '/', '+', '@', ',', '*':
		return true
	}
	return false
}

// value is an argument value: a bare word, a quoted string, or `[find ...]`.
type value struct {
	text   string
	quoted bool
	find   *findExpr
	pos    int
}

// cond is one `key=value` or `key~regex` condition of a where clause or
// a find.
type cond struct {
	key    string
	keyPos int
	value  string
	re     *regexp.Regexp // for `~`: matches the value anywhere
}

type findExpr struct {
	conds []cond
	pos   int
}

// arg is one argument of a command; key is empty for an unnamed argument
// (`detail`, `where`, `and`, the target of set/remove).
type arg struct {
	key    string
	keyPos int
	val    value
	re     *regexp.Regexp // `key~"regex"`, allowed in where clauses
}

type command struct {
	menu  string // "disk", "file", "system/resource", "system/clock"
	verb  string // "add", "set", "remove", "print"
	args  []arg
	end   int // length of the line, for errors at its end
	width int // terminal width print output wraps at; <= 0: no limit
}

// menuNode is one level of the RouterOS command tree.
type menuNode struct {
	path  string
	menus map[string]*menuNode
	verbs map[string]bool
}

var commandTree = &menuNode{
	menus: map[string]*menuNode{
		"disk": {path: "disk", verbs: map[string]bool{"add": true, "set": true, "remove": true, "print": true, "monitor-traffic": true}},
		"file": {path: "file", verbs: map[string]bool{"print": true, "remove": true}},
		"system": {path: "system", menus: map[string]*menuNode{
			"resource": {path: "system/resource", verbs: map[string]bool{"print": true}},
			"clock":    {path: "system/clock", verbs: map[string]bool{"print": true}},
		}},
	},
}

type parser struct {
	s string
	i int
}

func (p *parser) eof() bool { return p.i >= len(p.s) }

func (p *parser) skipSpace() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// badChar is the error for an unexpected character at pos.
func (p *parser) badChar(pos int) cliError {
	if pos >= len(p.s) {
		return syntaxError(len(p.s))
	}
	switch p.s[pos] {
	case ';', '\n', '\r':
		return expectedEnd(pos)
	}
	return syntaxError(pos)
}

// atTerminator reports whether the current position ends a word or value.
func (p *parser) atTerminator(inFind bool) bool {
	if p.eof() {
		return true
	}
	c := p.s[p.i]
	return c == ' ' || c == '\t' || (inFind && c == ']')
}

func (p *parser) word() string {
	start := p.i
	for p.i < len(p.s) && isBareChar(p.s[p.i]) {
		p.i++
	}
	return p.s[start:p.i]
}

func (p *parser) quoted() (string, error) {
	p.i++ // opening quote
	var b strings.Builder
	for {
		if p.eof() {
			return "", syntaxError(len(p.s))
		}
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			return b.String(), nil
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return "", syntaxError(p.i)
			}
			switch n := p.s[p.i+1]; n {
			case '"', '\\', '$', '?':
				b.WriteByte(n)
				p.i += 2
			default:
				return "", syntaxError(p.i)
			}
		case c == '$', c < 0x20, c == 0x7f:
			// `$` would be a variable reference; the simulator never
			// substitutes anything.
			return "", syntaxError(p.i)
		default:
			b.WriteByte(c)
			p.i++
		}
	}
}

func (p *parser) value(inFind bool) (value, error) {
	v := value{pos: p.i}
	if p.atTerminator(inFind) {
		return v, nil // `key=` followed by space: empty value
	}
	switch c := p.s[p.i]; {
	case c == '"':
		s, err := p.quoted()
		if err != nil {
			return v, err
		}
		v.text, v.quoted = s, true
	case c == '[' && !inFind:
		f, err := p.find()
		if err != nil {
			return v, err
		}
		v.find = f
	case isBareChar(c):
		v.text = p.word()
	default:
		return v, p.badChar(p.i)
	}
	if !p.atTerminator(inFind) {
		return v, p.badChar(p.i)
	}
	return v, nil
}

// find parses `[find k=v and k=v]` (also `[find where ...]`, `[find]`).
func (p *parser) find() (*findExpr, error) {
	f := &findExpr{pos: p.i}
	p.i++ // '['
	p.skipSpace()
	wpos := p.i
	if w := p.word(); w != "find" {
		if w == "" {
			return nil, p.badChar(p.i)
		}
		return nil, badCommandName(w, wpos)
	}
	if !p.atTerminator(true) {
		return nil, p.badChar(p.i)
	}
	needCond := false // after `and`
	first := true
	for {
		p.skipSpace()
		if p.eof() {
			return nil, syntaxError(len(p.s))
		}
		if p.s[p.i] == ']' {
			if needCond {
				return nil, syntaxError(p.i)
			}
			p.i++
			break
		}
		pos := p.i
		w := p.word()
		if w == "" {
			return nil, p.badChar(p.i)
		}
		if p.i < len(p.s) && (p.s[p.i] == '=' || p.s[p.i] == '~') {
			op := p.s[p.i]
			p.i++
			v, err := p.value(true)
			if err != nil {
				return nil, err
			}
			c := cond{key: w, keyPos: pos, value: v.text}
			if op == '~' {
				if c.re, err = compileCond(v); err != nil {
					return nil, err
				}
			}
			f.conds = append(f.conds, c)
			needCond, first = false, false
			continue
		}
		if !p.atTerminator(true) {
			return nil, p.badChar(p.i)
		}
		switch {
		case w == "where" && first:
			first = false
		case w == "and" && len(f.conds) > 0 && !needCond:
			needCond = true
		default:
			return nil, expectedEnd(pos)
		}
	}
	if !p.atTerminator(false) {
		return nil, p.badChar(p.i)
	}
	return f, nil
}

// parseCommand parses one RouterOS command line. A nil command with a nil
// error means there is nothing to run (an empty line or a bare menu path).
// It knows the command tree but not the arguments of each command; those
// are checked by the command itself.
func parseCommand(line string) (*command, error) {
	p := &parser{s: line}
	node := commandTree
	verb := ""
	for verb == "" {
		p.skipSpace()
		if p.eof() {
			return nil, nil
		}
		start := p.i
		if !isBareChar(p.s[p.i]) {
			return nil, p.badChar(p.i)
		}
		w := p.word()
		if p.i < len(p.s) && p.s[p.i] == '=' {
			return nil, expectedEnd(start)
		}
		if !p.atTerminator(false) {
			return nil, p.badChar(p.i)
		}
		// A word is a menu path: "/disk/add" is the same as "/disk add".
		off := 0
		for k, seg := range strings.Split(w, "/") {
			pos := start + off
			off += len(seg) + 1
			if seg == "" {
				switch {
				case k == 0:
					node = commandTree // leading slash: from the root
				case off > len(w):
					// trailing slash
				default:
					return nil, syntaxError(pos)
				}
				continue
			}
			if verb != "" {
				return nil, expectedEnd(pos)
			}
			if child, ok := node.menus[seg]; ok {
				node = child
			} else if node.verbs[seg] {
				verb = seg
			} else {
				return nil, badCommandName(seg, pos)
			}
		}
	}
	cmd := &command{menu: node.path, verb: verb, end: len(line)}
	for {
		p.skipSpace()
		if p.eof() {
			break
		}
		pos := p.i
		switch c := p.s[p.i]; {
		case c == '[':
			f, err := p.find()
			if err != nil {
				return nil, err
			}
			cmd.args = append(cmd.args, arg{keyPos: pos, val: value{find: f, pos: pos}})
		case c == '"':
			s, err := p.quoted()
			if err != nil {
				return nil, err
			}
			if !p.atTerminator(false) {
				return nil, p.badChar(p.i)
			}
			cmd.args = append(cmd.args, arg{keyPos: pos, val: value{text: s, quoted: true, pos: pos}})
		case isBareChar(c):
			w := p.word()
			if p.i < len(p.s) && (p.s[p.i] == '=' || p.s[p.i] == '~') {
				op := p.s[p.i]
				p.i++
				v, err := p.value(false)
				if err != nil {
					return nil, err
				}
				a := arg{key: w, keyPos: pos, val: v}
				if op == '~' {
					if a.re, err = compileCond(v); err != nil {
						return nil, err
					}
				}
				cmd.args = append(cmd.args, a)
				continue
			}
			if !p.atTerminator(false) {
				return nil, p.badChar(p.i)
			}
			cmd.args = append(cmd.args, arg{keyPos: pos, val: value{text: w, pos: pos}})
		default:
			return nil, p.badChar(p.i)
		}
	}
	return cmd, nil
}

// printArgs interprets the arguments of a print command:
// `[detail] [without-paging] [where k=v [and k=v]...]`.
func printArgs(cmd *command, known map[string]bool) ([]cond, error) {
	var conds []cond
	inWhere, needCond := false, false
	for _, a := range cmd.args {
		switch {
		case a.val.find != nil:
			return nil, expectedEnd(a.keyPos)
		case !inWhere && a.key == "" && !a.val.quoted && (a.val.text == "detail" || a.val.text == "without-paging"):
		case !inWhere && a.key == "" && !a.val.quoted && a.val.text == "where":
			inWhere = true
		case inWhere && a.key == "" && !a.val.quoted && a.val.text == "and" && len(conds) > 0 && !needCond:
			needCond = true
		case a.re != nil && !inWhere:
			return nil, expectedEnd(a.keyPos)
		case inWhere && a.key != "":
			if !known[a.key] {
				return nil, expectedEnd(a.keyPos)
			}
			conds = append(conds, cond{key: a.key, keyPos: a.keyPos, value: a.val.text, re: a.re})
			needCond = false
		default:
			return nil, expectedEnd(a.keyPos)
		}
	}
	if needCond {
		return nil, syntaxError(cmd.end) // a dangling `and`
	}
	return conds, nil
}

// compileCond compiles the regular expression of a `~` condition. RouterOS
// uses POSIX extended expressions; Go's syntax covers what a where clause
// needs.
func compileCond(v value) (*regexp.Regexp, error) {
	if v.find != nil {
		return nil, syntaxError(v.pos)
	}
	re, err := regexp.Compile(v.text)
	if err != nil {
		return nil, failure("invalid regular expression")
	}
	return re, nil
}

// matches reports whether an item's properties satisfy all conditions.
// A condition on a property the item does not have does not match.
func matches(props []prop, conds []cond) bool {
	for _, c := range conds {
		ok := false
		for _, p := range props {
			if p.key != c.key {
				continue
			}
			if c.re != nil {
				ok = c.re.MatchString(p.raw)
				break
			}
			// Compare against the plain value and the printed form, so
			// that `size=53 687 091 200` and `size=53687091200` both work.
			ok = p.raw == c.value || strings.Trim(p.text, `"`) == c.value
			break
		}
		if !ok {
			return false
		}
	}
	return true
}
