package main

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/srvlab/rds-csi/pkg/rds"
)

// The self-test's measurements of RouterOS facts (selftestFacts) on the
// commands it ran: what RouterOS printed, read from the transcript.

// measurePrint records what the print of a disk showed about wrapping
// and sizes.
func (st *selftestRun) measurePrint(d *rds.Disk) {
	r, ok := st.tr.last("/disk print detail where slot=\"" + d.Slot + "\"")
	if !ok {
		return
	}
	longest, continued := 0, 0
	lines := strings.Split(strings.ReplaceAll(r.Output, "\r", ""), "\n")
	for i, l := range lines {
		longest = max(longest, len(l))
		// A line that does not start with key=, an entry number or the
		// legend continues a value broken on the line before.
		t := strings.TrimSpace(l)
		if i > 0 && t != "" && !strings.HasPrefix(t, "Flags:") && !startsWithKey(t) && !entryLine.MatchString(l) && !strings.HasPrefix(lines[i-1], "Flags:") {
			continued++
		}
	}
	width := loginWidth(st.o.loginOptions)
	switch {
	case width == 0:
		st.fact("login-width", skipped, "the login options %q ask for no width; longest print line %d columns", st.o.loginOptions, longest)
	case longest > 80:
		st.fact("login-width", confirmed, "longest print line %d columns with width %d asked (80 is the default)", longest, width)
	case width <= 80:
		st.fact("login-width", skipped, "width %d asked, longest print line %d columns: cannot tell from the default of 80", width, longest)
	default:
		st.fact("login-width", contradicted, "width %d asked, but the longest print line has %d columns (tolerated: values are rejoined)", width, longest)
	}
	if d.FilePath == rds.VolumeFilePath(st.o.basePath, d.Slot) && d.NQN == st.o.nqnPrefix+d.Slot {
		st.fact("wrap-rejoin", confirmed, "file-path (%d characters) and NQN read back whole; longest line %d columns, %d continuation lines", len(d.FilePath), longest, continued)
	} else {
		st.fact("wrap-rejoin", contradicted, "read back file-path %q, NQN %q", d.FilePath, d.NQN)
	}
	if i := strings.Index(r.Output, " size="); i >= 0 {
		v := strings.Fields(r.Output[i+len(" size="):])
		got := ""
		for _, w := range v {
			if !allDigits(w) {
				break
			}
			got += w + " "
		}
		got = strings.TrimSpace(got)
		if got != "" && strings.ReplaceAll(got, " ", "") == fmt.Sprint(d.Size) {
			st.fact("size-print", confirmed, "size=%s", got)
		} else {
			st.fact("size-print", contradicted, "size= printed as %q for %d bytes (the client falls back on file-size=)", got, d.Size)
		}
	}
}

// measureFlagColumns records how the last /disk listing printed its flags.
func (st *selftestRun) measureFlagColumns() {
	if r, ok := st.tr.last("/disk print detail where type=file"); ok {
		status, measured := flagColumnsFact(r.Output)
		st.fact("flag-columns", status, "%s", measured)
		status, measured = legendUsedFact(r.Output)
		st.fact("legend-used", status, "%s", measured)
	}
}

// legendUsedFact says whether a listing's legend names only the flags its
// entries carry.
func legendUsedFact(out string) (status, measured string) {
	legend, fields := flagFields(out)
	if legend == "" || len(fields) == 0 {
		return skipped, "the listing printed no legend or no entry"
	}
	var unused []string
	for _, l := range legend {
		carried := false
		for _, f := range fields {
			carried = carried || strings.ContainsRune(f, l)
		}
		if !carried {
			unused = append(unused, string(l))
		}
	}
	if len(unused) > 0 {
		return contradicted, fmt.Sprintf("legend %q names %s, which no entry carries (tolerated)", legend, strings.Join(unused, ", "))
	}
	return confirmed, fmt.Sprintf("legend %q, each letter carried by an entry", legend)
}

// flagColumnsFact says whether a listing printed its flags in one column
// per letter of its Flags: legend (blank where unset), or otherwise
// (compacted letters, another width).
func flagColumnsFact(out string) (status, measured string) {
	legend, fields := flagFields(out)
	if legend == "" {
		return skipped, "the listing printed no Flags: legend"
	}
	blanks := 0
	for _, f := range fields {
		if len(f) != len(legend) {
			return contradicted, fmt.Sprintf("legend %q (%d letters), an entry's flag field %q", legend, len(legend), f)
		}
		for i := range f {
			switch f[i] {
			case ' ':
				blanks++
			case legend[i]:
			default:
				return contradicted, fmt.Sprintf("legend %q, an entry's flag field %q has %c in %c's column", legend, f, f[i], legend[i])
			}
		}
	}
	if blanks == 0 {
		return skipped, fmt.Sprintf("legend %q; no entry had an unset flag inside its field, so columns cannot be told from compacted letters", legend)
	}
	return confirmed, fmt.Sprintf("legend %q, flag fields %q", legend, fields)
}

// measureClosed records whether RouterOS printed a closed disk's port,
// NQN and allowed host (issue 22, item 5), from the raw output of the last
// print that listed it: the client fills in what it can confirm with
// where-conditions, so the parsed disk cannot tell.
func (st *selftestRun) measureClosed(slot, when string) {
	var out string
	for _, r := range st.tr.all() {
		if strings.Contains(r.Command, "/disk print detail where slot=\""+slot+"\"") && strings.Contains(r.Output, "type=") {
			out = r.Output
		}
	}
	if out == "" {
		return
	}
	lines := strings.Split(strings.ReplaceAll(out, "\r", ""), "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	joined := strings.Join(lines, " ") + " " + strings.Join(lines, "") // a key broken across lines too
	var shown, hidden []string
	for _, key := range []string{"nvme-tcp-server-port=", "nvme-tcp-server-nqn=", "nvme-tcp-server-allow-host-name="} {
		if strings.Contains(joined, key) {
			shown = append(shown, strings.TrimSuffix(key, "="))
		} else {
			hidden = append(hidden, strings.TrimSuffix(key, "="))
		}
	}
	switch {
	case len(hidden) == 0:
		st.fact("closed-print", confirmed, "%s: port, NQN and allowed host printed", when)
	default:
		st.closedHidden = true
		st.fact("closed-print", contradicted, "%s: %s not printed (printed: %s); the client confirms them with where-conditions", when, strings.Join(hidden, ", "), strings.Join(shown, ", "))
	}
}

// flagFields finds a listing's legend letters ("BMt") and each entry's
// flag field as printed: as many characters after the entry number and
// its space as the legend has letters (compacted letters, or a field of
// another width, show up as a mismatch).
func flagFields(out string) (legend string, fields []string) {
	var legendText strings.Builder
	inLegend := false
	for _, l := range strings.Split(strings.ReplaceAll(out, "\r", ""), "\n") {
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "Flags:") {
			inLegend = true
			legendText.WriteString(strings.TrimPrefix(t, "Flags:"))
			continue
		}
		m := entryLine.FindString(l)
		if m == "" {
			if inLegend {
				legendText.WriteString(" " + strings.TrimSpace(l))
			}
			continue
		}
		if inLegend {
			inLegend = false
			for _, part := range strings.Split(legendText.String(), ";") {
				if letter, _, ok := strings.Cut(strings.TrimSpace(part), " - "); ok && len(letter) == 1 {
					legend += letter
				}
			}
		}
		rest := l[len(m):]
		if len(rest) > len(legend) && rest[len(legend)] == ' ' {
			fields = append(fields, rest[:len(legend)])
		} else {
			fields = append(fields, rest[:min(len(rest), len(legend)+1)])
		}
	}
	return legend, fields
}

// entryLine is the start of an entry: its number, right-aligned in a few
// columns, and one space (continuation lines are indented further).
var entryLine = regexp.MustCompile(`^ {0,3}[0-9]+ `)

func startsWithKey(t string) bool {
	k, _, ok := strings.Cut(t, "=")
	return ok && k != "" && !strings.ContainsAny(k, " \"") && k[0] >= 'a' && k[0] <= 'z'
}

func allDigits(s string) bool {
	for i := range s {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// loginWidth is the width option of RouterOS login options ("ct511w4098h"
// asks for 511), or 0.
func loginWidth(opts string) int {
	n, num := 0, 0
	for i := range opts {
		switch c := opts[i]; {
		case c >= '0' && c <= '9':
			num = num*10 + int(c-'0')
		case c == 'w':
			n, num = num, 0
		default:
			num = 0
		}
	}
	return n
}

// observe records what the whole transcript shows.
func (st *selftestRun) observe() {
	silent, noisy := 0, 0
	for _, r := range st.tr.all() {
		if strings.Contains(r.Command, " print") || r.Err != nil {
			continue
		}
		if strings.TrimSpace(r.Output) == "" {
			silent++
		} else {
			noisy++
		}
	}
	switch {
	case noisy > 0:
		st.fact("silent-success", contradicted, "%d successful add/set/remove commands printed something, %d nothing", noisy, silent)
	case silent > 0:
		st.fact("silent-success", confirmed, "%d successful add/set/remove commands, all printed nothing", silent)
	}
	if st.o.data == nil {
		st.fact("copy-data", skipped, "the data check was skipped: run with -data on a Linux host that reaches the RDS over NVMe/TCP")
		st.fact("allow-host-enforced", skipped, "needs -data (a host connecting over NVMe/TCP)")
		st.fact("password-enforced", skipped, "needs -data (a host connecting over NVMe/TCP with a kernel that has NVMe in-band authentication)")
	}
}
