package rdssim

// ValueBreak is where a value longer than the rest of a line is broken.
// RouterOS breaks at the terminal width (round-1 hardware output), and was
// also seen breaking an unquoted file-path well short of it, before a '-'
// (the peer driver's hardware fix, its commit a28f18e); its rule is not
// known, so the simulator offers both.
type ValueBreak string

const (
	// ValueBreakWidth breaks at exactly the width (the default).
	ValueBreakWidth ValueBreak = "width"
	// ValueBreakHyphen breaks before the last '-' of the value that fits,
	// the rest of the line left blank; at the width when there is none.
	ValueBreakHyphen ValueBreak = "hyphen"
)

// ParseValueBreak parses "width" or "hyphen" ("" is width).
func ParseValueBreak(s string) (ValueBreak, error) {
	return parseChoice("value break", s, ValueBreakWidth, ValueBreakHyphen)
}
