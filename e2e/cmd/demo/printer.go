package main

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// printer turns the framework's timeline (every line it logs through the
// runner) into the demo's live output: the API object changes stand out,
// the harness's own bookkeeping is dimmed, and each step's object changes
// are counted by kind for the summary table.
type printer struct {
	w       io.Writer
	color   bool
	verbose bool

	mu        sync.Mutex
	tally     map[string]int // object kind -> changes in the current step
	artifacts string         // the artifact directory, once the framework has logged it
}

func newPrinter(w *os.File, verbose bool) *printer {
	color := false
	if st, err := w.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 && os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb" {
		color = true
	}
	return &printer{w: w, color: color, verbose: verbose, tally: map[string]int{}}
}

const (
	bold   = "\033[1m"
	dim    = "\033[2m"
	red    = "\033[31m"
	green  = "\033[32m"
	yellow = "\033[33m"
	cyan   = "\033[36m"
	reset  = "\033[0m"
)

func (p *printer) paint(style, s string) string {
	if !p.color || style == "" {
		return s
	}
	return style + s + reset
}

// objectKinds are the prefixes of framework.WatchObjects' lines, with the
// short name the summary uses.
var objectKinds = []struct{ prefix, short string }{
	{"VolumeAttachment ", "VolumeAttachment"},
	{"PVC ", "PVC"},
	{"PV ", "PV"},
	{"Node ", "Node"},
	{"Pod ", "Pod"},
	{"Event ", "Event"},
}

// artifactsLine is how the framework announces a run's artifact directory.
const artifactsLine = "artifacts (timeline.log, component logs): "

// artifactDir is the run's artifact directory ("" before the framework made it).
func (p *printer) artifactDir() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.artifacts
}

// timelineLine matches framework.Timeline's "%9.3fs  message".
var timelineLine = regexp.MustCompile(`^\s*(\d+\.\d{3})s  (.*)$`)

// noise are harness lines only -v shows: every wait, process start and
// the harness's own step markers (the demo prints its own).
var noise = []string{"== ", "end of scenario", "started ", "created ", "stopped ", "waiting for ", "rds-sim ", "kube-apiserver at ", "driver binary from"}

// line is the runner's log sink.
func (p *printer) line(s string) {
	s = strings.TrimRight(s, "\n")
	m := timelineLine.FindStringSubmatch(s)
	p.mu.Lock()
	defer p.mu.Unlock()
	if m == nil {
		if dir, ok := strings.CutPrefix(s, artifactsLine); ok {
			p.artifacts = strings.TrimSpace(dir)
		}
		style := dim
		switch {
		case strings.HasPrefix(s, "ERROR"):
			style = red
		case strings.HasPrefix(s, "interrupted"):
			style = yellow
		}
		fmt.Fprintln(p.w, p.paint(style, "   "+s))
		return
	}
	at, msg := m[1], m[2]
	for _, k := range objectKinds {
		if strings.HasPrefix(msg, k.prefix) {
			rest := msg[len(k.prefix):]
			if k.short == "Event" {
				if !p.verbose && boringEvent(msg) {
					return
				}
				rest = eventText(rest)
			}
			p.tally[k.short]++
			if !p.verbose {
				rest = shorten(abbrev(rest))
			}
			style := cyan
			if k.short == "VolumeAttachment" {
				style = cyan + bold // what the driver's decisions are about
			}
			fmt.Fprintf(p.w, "   %s  %s\n", p.paint(dim, fmt.Sprintf("%8ss", at)), p.paint(style, k.prefix)+rest)
			return
		}
	}
	if !p.verbose {
		for _, n := range noise {
			if strings.HasPrefix(msg, n) {
				return
			}
		}
	}
	fmt.Fprintf(p.w, "   %s  %s\n", p.paint(dim, fmt.Sprintf("%8ss", at)), p.paint(dim, msg))
}

// boringEvent: events about the control plane's own bookkeeping (leader
// elections, node registration), not the volume.
func boringEvent(msg string) bool {
	for _, s := range []string{" Lease/", " LeaderElection ", " RegisteredNode ", " NodeHasSufficient", " Starting "} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// eventText drops the Event object's own name (ns/name.<hex>) from a
// timeline line: what matters is the object it is about.
func eventText(s string) string {
	if _, after, ok := strings.Cut(s, ": "); ok {
		return after
	}
	return s
}

var (
	uuidRE  = regexp.MustCompile(`([0-9a-f]{8})-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	hash64  = regexp.MustCompile(`\b(csi-[0-9a-f]{8})[0-9a-f]{56}\b`)
	longNum = regexp.MustCompile(`\.t-[0-9]{10,}`)
)

// abbrev shortens generated names (PV UUIDs, VolumeAttachment hashes) to
// their first 8 hex digits; -v prints them whole.
func abbrev(s string) string {
	s = uuidRE.ReplaceAllString(s, "$1…")
	s = hash64.ReplaceAllString(s, "$1…")
	return longNum.ReplaceAllString(s, ".t-…")
}

// shorten cuts a long object summary (an event message) to a terminal line.
func shorten(s string) string {
	const max = 200
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	r := []rune(s)
	return string(r[:max]) + "…"
}

// takeTally returns and resets the object-change counts since the last call.
func (p *printer) takeTally() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	kinds := make([]string, 0, len(p.tally))
	for k := range p.tally {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return kindOrder(kinds[i]) < kindOrder(kinds[j]) })
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, p.tally[k]))
	}
	p.tally = map[string]int{}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func kindOrder(k string) int {
	for i, o := range objectKinds {
		if o.short == k {
			return i
		}
	}
	return len(objectKinds)
}

// say prints one of the demo's own lines.
func (p *printer) say(style, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.w, p.paint(style, fmt.Sprintf(format, args...)))
}

// sayShort is say with generated names abbreviated (unless -v).
func (p *printer) sayShort(style, format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	if !p.verbose {
		s = abbrev(s)
	}
	p.say(style, "%s", s)
}

// header starts a step.
func (p *printer) header(n, total int, title, what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.w)
	fmt.Fprintf(p.w, "%s %s\n", p.paint(bold, fmt.Sprintf("── %d/%d  %s", n, total, title)), p.paint(dim, "── "+what))
}

// stepRecord is one row of the summary table.
type stepRecord struct {
	title   string
	took    time.Duration
	objects string // object changes by kind during the step
	result  string
	status  string // ok, FAILED, interrupted, skipped
}

// table prints the summary table.
func (p *printer) table(rows []*stepRecord, total time.Duration) {
	head := []string{"#", "step", "took", "status", "API objects changed (watch events)", "result"}
	cells := [][]string{head}
	for i, r := range rows {
		result := r.result
		if !p.verbose {
			result = abbrev(result)
		}
		cells = append(cells, []string{fmt.Sprint(i + 1), r.title, fmtDur(r.took), r.status, r.objects, result})
	}
	cells = append(cells, []string{"", "total", fmtDur(total), "", "", ""})
	width := make([]int, len(head))
	for _, row := range cells {
		for i, c := range row {
			if n := utf8.RuneCountInString(c); n > width[i] {
				width[i] = n
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	rule := func() {
		var b strings.Builder
		for i, w := range width {
			if i > 0 {
				b.WriteString("-+-")
			}
			b.WriteString(strings.Repeat("-", w))
		}
		fmt.Fprintln(p.w, b.String())
	}
	for ri, row := range cells {
		if ri == 1 || ri == len(cells)-1 {
			rule()
		}
		var b strings.Builder
		for i, c := range row {
			if i > 0 {
				b.WriteString(" | ")
			}
			pad := width[i] - utf8.RuneCountInString(c)
			if i == 0 || i == 2 { // numbers right-aligned
				b.WriteString(strings.Repeat(" ", pad) + c)
			} else {
				b.WriteString(c + strings.Repeat(" ", pad))
			}
		}
		line := strings.TrimRight(b.String(), " ")
		switch {
		case ri == 0:
			line = p.paint(bold, line)
		case ri < len(cells)-1 && row[3] != "ok" && row[3] != "skipped":
			line = p.paint(red, line)
		}
		fmt.Fprintln(p.w, line)
	}
}

func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < 10*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	default:
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
}
