package rdssim

// Variants of print output where RouterOS's behaviour is not known.

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

// Legend is which flags the Flags legend of a listing names. The RDS2216
// capture of one exported disk named only B and t, the flags in use; a
// hAP ax3 capture named X (disabled), which its one disk did not carry.
// Which RouterOS does on RDS (or whether it depends on the version) is
// not known, so the simulator offers both.
type Legend string

const (
	// LegendUsed names only the flags the listing's entries carry (the
	// default); a listing with no entries names them all.
	LegendUsed Legend = "used"
	// LegendAll names every flag the simulator sets (B, M, t), a column
	// for each, blank where an entry does not carry it.
	LegendAll Legend = "all"
)

// ParseLegend parses "used" or "all" ("" is used).
func ParseLegend(s string) (Legend, error) {
	return parseChoice("legend", s, LegendUsed, LegendAll)
}

// layout is how this server lays out print output for a terminal width
// columns wide.
func (s *Server) layout(width int) layout {
	return layout{width: width, beforeHyphen: s.valueBreak == ValueBreakHyphen, legendAll: s.legend == LegendAll}
}
