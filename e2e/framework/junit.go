package framework

import (
	"encoding/xml"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// The JUnit report Ginkgo writes (--junit-report): one <testcase> a spec,
// with the spec's state in its status attribute ("passed", "skipped",
// "failed", "panicked", "timedout", "interrupted", "aborted", "pending")
// and a <skipped> or <failure>/<error> element saying why. Kubernetes'
// e2e.test writes it this way; the kubelet tier reads it to hold the
// storage suite's result.

// JUnitCase is one spec of a JUnit report.
type JUnitCase struct {
	Name     string
	Status   string // Ginkgo's state; "passed", "skipped" or "failed" for other writers
	Duration time.Duration
	// Message is why it was skipped, or what failed.
	Message string
	// Detail is the failure's text (location, stack).
	Detail string
}

// Failed says whether the case did not pass and was not skipped.
func (c JUnitCase) Failed() bool {
	switch c.Status {
	case "passed", "skipped", "pending":
		return false
	}
	return true
}

type junitReport struct {
	XMLName xml.Name
	Suites  []junitSuite `xml:"testsuite"`
	// A report may be a single <testsuite> at the top.
	Cases []junitCase `xml:"testcase"`
}

type junitSuite struct {
	Cases []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *junitFailure `xml:"failure"`
	Error   *junitFailure `xml:"error"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

// ReadJUnit reads the specs of a JUnit report. A report with no spec at
// all is an error: an empty report proves nothing.
func ReadJUnit(path string) ([]JUnitCase, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseJUnit(b)
}

// ParseJUnit is ReadJUnit on the report's bytes.
func ParseJUnit(b []byte) ([]JUnitCase, error) {
	var r junitReport
	if err := xml.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("JUnit report: %w", err)
	}
	raw := r.Cases
	for _, s := range r.Suites {
		raw = append(raw, s.Cases...)
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("JUnit report: no test cases (root element <%s>)", r.XMLName.Local)
	}
	out := make([]JUnitCase, 0, len(raw))
	for _, c := range raw {
		jc := JUnitCase{Name: c.Name, Status: c.Status, Duration: time.Duration(c.Time * float64(time.Second))}
		f := c.Failure
		if f == nil {
			f = c.Error
		}
		switch {
		case f != nil:
			if jc.Status == "" || jc.Status == "passed" || jc.Status == "skipped" {
				// A <failure> always means the case failed, whatever the
				// status attribute says.
				jc.Status = "failed"
			}
			jc.Message, jc.Detail = f.Message, strings.TrimSpace(f.Text)
		case c.Skipped != nil:
			if jc.Status == "" {
				jc.Status = "skipped"
			}
			jc.Message = c.Skipped.Message
		case jc.Status == "":
			jc.Status = "passed"
		}
		out = append(out, jc)
	}
	return out, nil
}

// JUnitSummary counts a report's specs by outcome.
type JUnitSummary struct {
	Passed, Failed int
	// Skipped are specs that were selected and skipped themselves (the
	// driver lacks a capability, the pattern does not apply); Filtered
	// were not selected by the run's focus and skip ("skipped" with no
	// reason in Ginkgo's report).
	Skipped, Filtered int
	// Duration is the sum of the cases' durations.
	Duration time.Duration
}

// filteredMessage is the skip message Ginkgo gives specs the run's focus
// or skip left out.
const filteredMessage = "skipped"

// Spec says whether a case is a spec ([It]), not one of the suite's own
// nodes ([SynchronizedBeforeSuite], [ReportAfterSuite] ...).
func (c JUnitCase) Spec() bool {
	return !strings.HasPrefix(c.Name, "[") || strings.HasPrefix(c.Name, "[It]")
}

// SummarizeJUnit counts specs; a suite node that failed (a failed setup)
// counts as a failure, one that passed not at all.
func SummarizeJUnit(cases []JUnitCase) JUnitSummary {
	var s JUnitSummary
	for _, c := range cases {
		s.Duration += c.Duration
		switch {
		case c.Failed():
			s.Failed++
		case !c.Spec():
		case c.Status == "passed":
			s.Passed++
		case strings.TrimSpace(c.Message) == filteredMessage:
			s.Filtered++
		default:
			s.Skipped++
		}
	}
	return s
}

// SkipReasons groups the cases that skipped themselves by the reason
// given, most common first: "reason (n)".
func SkipReasons(cases []JUnitCase) []string {
	count := map[string]int{}
	for _, c := range cases {
		if (c.Status == "skipped" || c.Status == "pending") && strings.TrimSpace(c.Message) != filteredMessage {
			msg := strings.TrimPrefix(strings.TrimSpace(c.Message), "skipped - ")
			if i := strings.IndexByte(msg, '\n'); i >= 0 {
				msg = msg[:i]
			}
			count[msg]++
		}
	}
	reasons := make([]string, 0, len(count))
	for r := range count {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if count[reasons[i]] != count[reasons[j]] {
			return count[reasons[i]] > count[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	for i, r := range reasons {
		reasons[i] = fmt.Sprintf("%s (%d)", r, count[r])
	}
	return reasons
}
