package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// Timeline is a scenario's run log: one line per event with the time since
// the scenario started, written to <artifacts>/timeline.log as it happens
// (so a hung or killed run still leaves it) and mirrored to t.Log.
type Timeline struct {
	tb    testing.TB
	start time.Time
	path  string

	mu     sync.Mutex
	f      *os.File
	closed bool
}

// NewTimeline creates dir/timeline.log; it is closed in tb.Cleanup, after
// every later-registered cleanup has logged what it stopped.
func NewTimeline(tb testing.TB, dir string) *Timeline {
	tb.Helper()
	path := filepath.Join(dir, "timeline.log")
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	tl := &Timeline{tb: tb, start: time.Now(), path: path, f: f}
	fmt.Fprintf(f, "# %s, started %s\n", tb.Name(), tl.start.UTC().Format(time.RFC3339Nano))
	tb.Cleanup(func() {
		result := "PASS"
		if tb.Failed() {
			result = "FAIL"
		}
		tl.Logf("end of scenario: %s", result)
		tl.mu.Lock()
		defer tl.mu.Unlock()
		tl.closed = true
		if err := tl.f.Close(); err != nil {
			tb.Errorf("timeline: %v", err)
		}
		tb.Logf("timeline: %s", path)
	})
	return tl
}

// Path is the timeline file.
func (tl *Timeline) Path() string { return tl.path }

// Since is the time since the scenario started.
func (tl *Timeline) Since() time.Duration { return time.Since(tl.start) }

// Logf appends one event.
func (tl *Timeline) Logf(format string, args ...any) {
	line := fmt.Sprintf("%9.3fs  %s", time.Since(tl.start).Seconds(), fmt.Sprintf(format, args...))
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.closed {
		return
	}
	fmt.Fprintln(tl.f, line)
	tl.tb.Log(line)
}

// Step logs the start of a named step and returns the function that logs
// its end with the duration.
func (tl *Timeline) Step(name string) (done func()) {
	t0 := time.Now()
	tl.Logf("== %s", name)
	return func() { tl.Logf("== %s: done in %s", name, time.Since(t0).Round(time.Millisecond)) }
}

// objectLog remembers the last summary logged per object, so the timeline
// shows changes, not every resync or heartbeat.
type objectLog struct {
	tl   *Timeline
	mu   sync.Mutex
	last map[string]string
}

func newObjectLog(tl *Timeline) *objectLog {
	return &objectLog{tl: tl, last: map[string]string{}}
}

func (o *objectLog) changed(key, summary string) {
	o.mu.Lock()
	prev, seen := o.last[key]
	o.last[key] = summary
	o.mu.Unlock()
	switch {
	case !seen:
		o.tl.Logf("%s created: %s", key, summary)
	case prev != summary:
		o.tl.Logf("%s: %s", key, summary)
	}
}

func (o *objectLog) deleted(key string) {
	o.mu.Lock()
	delete(o.last, key)
	o.mu.Unlock()
	o.tl.Logf("%s deleted", key)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func joinNonEmpty(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, " ")
}
