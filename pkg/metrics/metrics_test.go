package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/srvlab/rds-csi/pkg/fencing"
)

// scrape fetches /metrics from srv the way Prometheus does and parses it.
func scrape(t *testing.T, srv *httptest.Server) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape: status %d: %s", resp.StatusCode, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing the exposition: %v", err)
	}
	return families
}

// value is the value of the series of family name with exactly the given
// labels (a histogram's sample count), or an error naming what is missing.
func value(families map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, error) {
	f, ok := families[name]
	if !ok {
		return 0, fmt.Errorf("family %s missing", name)
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) != len(labels) {
			continue
		}
		match := true
		for k, v := range labels {
			if got[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue(), nil
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue(), nil
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount()), nil
		}
		return 0, fmt.Errorf("family %s has unexpected type %v", name, f.GetType())
	}
	return 0, fmt.Errorf("family %s has no series %v", name, labels)
}

// gather is m's families by name, straight from the registry.
func gather(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range families {
		out[f.GetName()] = f
	}
	return out
}

func TestScrapeHasEveryFamilyAndRecordingChangesIt(t *testing.T) {
	m := New()
	m.AddRDS("rack-a")
	m.AddRDS("rack-b")
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	type series struct {
		name   string
		labels map[string]string
	}
	// Each row: a series, what it must be before recording (the families
	// without labels and the pre-created label values exist at once), the
	// recording, and what it must be after.
	tests := []struct {
		series
		before float64
		absent bool // the series appears only once recorded
		record func()
		after  float64
	}{
		{series{"rds_csi_publish_total", map[string]string{"result": "attached"}}, 0, false, func() { m.PublishResult(ResultAttached) }, 1},
		{series{"rds_csi_publish_total", map[string]string{"result": "refused"}}, 0, false, func() { m.PublishResult(ResultRefused); m.PublishResult(ResultRefused) }, 2},
		{series{"rds_csi_publish_total", map[string]string{"result": "aborted"}}, 0, true, func() { m.PublishResult("aborted") }, 1},
		{series{"rds_csi_unpublish_total", map[string]string{"result": "detached"}}, 0, false, func() { m.UnpublishResult(ResultDetached) }, 1},
		{series{"rds_csi_publish_decision_duration_seconds", map[string]string{}}, 0, false, func() { m.PublishDecision(3 * time.Millisecond) }, 1},
		{series{"rds_csi_attach_conflicts_total", map[string]string{}}, 0, false, m.Conflict, 1},
		{series{"rds_csi_fences_total", map[string]string{"reason": "NodeDeleted"}}, 0, false, func() { m.Fenced(fencing.FenceNodeDeleted) }, 1},
		{series{"rds_csi_fences_total", map[string]string{"reason": "OutOfService"}}, 0, false, func() { m.Fenced(fencing.FenceOutOfService) }, 1},
		{series{"rds_csi_fences_total", map[string]string{"reason": "NotReady"}}, 0, false, func() { m.Fenced(fencing.FenceNotReady) }, 1},
		{series{"rds_csi_fences_total", map[string]string{"reason": "NodeRecreated"}}, 0, false, func() { m.Fenced(fencing.FenceNodeRecreated) }, 1},
		{series{"rds_csi_orphaned_claims", map[string]string{}}, 0, false, func() { m.OrphanedClaims(2) }, 2},
		{series{"rds_csi_migrations_started_total", map[string]string{}}, 0, false, m.MigrationStarted, 1},
		{series{"rds_csi_migrations_ended_total", map[string]string{"reason": "completed"}}, 0, false, m.MigrationFinished, 1},
		{series{"rds_csi_migrations_ended_total", map[string]string{"reason": "timed_out"}}, 0, false, m.MigrationTimedOut, 1},
		{series{"rds_csi_rds_command_duration_seconds", map[string]string{"rds": "rack-a", "command": "disk_add", "result": "success"}}, 0, true, func() {
			m.ObserveRDSCommand("rack-a", "/disk add type=file file-path=/storage-pool/kubernetes-volumes/pvc-1.img file-size=1G slot=pvc-1", 40*time.Millisecond, nil)
		}, 1},
		{series{"rds_csi_rds_command_duration_seconds", map[string]string{"rds": "rack-b", "command": "disk_print", "result": "timeout"}}, 0, true, func() {
			m.ObserveRDSCommand("rack-b", "disk print", time.Second, fmt.Errorf("waiting for the RDS: %w", context.DeadlineExceeded))
		}, 1},
		{series{"rds_csi_rds_command_duration_seconds", map[string]string{"rds": "rack-a", "command": "system_resource_print", "result": "error"}}, 0, true, func() {
			m.ObserveRDSCommand("rack-a", "/system resource print", time.Millisecond, errors.New("failure: no such item"))
		}, 1},
		{series{"rds_csi_rds_ssh_connected", map[string]string{"rds": "rack-a"}}, 0, false, func() { m.SetRDSConnected("rack-a", true) }, 1},
		{series{"rds_csi_rds_ssh_connected", map[string]string{"rds": "rack-b"}}, 0, false, func() {}, 0},
		{series{"rds_csi_index_volumes", map[string]string{}}, 0, false, func() { m.SetIndexSize(7, 9, 3) }, 7},
		{series{"rds_csi_index_attachments", map[string]string{}}, 0, false, func() { m.SetIndexSize(7, 9, 3) }, 9},
		{series{"rds_csi_index_nodes", map[string]string{}}, 0, false, func() { m.SetIndexSize(7, 9, 3) }, 3},
		{series{"rds_csi_leader", map[string]string{}}, 0, false, func() { m.SetLeader(true) }, 1},
	}

	before := scrape(t, srv)
	for _, tc := range tests {
		got, err := value(before, tc.name, tc.labels)
		switch {
		case tc.absent && err == nil:
			t.Errorf("before recording: %s%v exists already (%v)", tc.name, tc.labels, got)
		case !tc.absent && err != nil:
			t.Errorf("before recording: %v", err)
		case !tc.absent && got != tc.before:
			t.Errorf("before recording: %s%v = %v, want %v", tc.name, tc.labels, got, tc.before)
		}
	}
	for _, tc := range tests {
		tc.record()
	}
	after := scrape(t, srv)
	for _, tc := range tests {
		got, err := value(after, tc.name, tc.labels)
		if err != nil {
			t.Errorf("after recording: %v", err)
			continue
		}
		if got != tc.after {
			t.Errorf("after recording: %s%v = %v, want %v", tc.name, tc.labels, got, tc.after)
		}
	}
	// The process and runtime collectors are on the same registry.
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if _, ok := after[name]; !ok {
			t.Errorf("family %s missing", name)
		}
	}

	// Booleans go back to 0.
	m.SetLeader(false)
	m.SetRDSConnected("rack-a", false)
	final := scrape(t, srv)
	for name, labels := range map[string]map[string]string{"rds_csi_leader": {}, "rds_csi_rds_ssh_connected": {"rds": "rack-a"}} {
		if got, err := value(final, name, labels); err != nil || got != 0 {
			t.Errorf("%s = %v (%v), want 0", name, got, err)
		}
	}
}

func TestEveryFamilyHasThePrefixAndPassesPromlint(t *testing.T) {
	m := New()
	// Create every labelled series so the linter sees them all.
	m.ObserveRDSCommand("rack-a", "disk_add", time.Millisecond, nil)
	m.AddRDS("rack-a")
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	own := 0
	for _, f := range families {
		name := f.GetName()
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") || strings.HasPrefix(name, "promhttp_") {
			continue
		}
		own++
		if !strings.HasPrefix(name, Namespace+"_") {
			t.Errorf("family %s lacks the %s_ prefix", name, Namespace)
		}
		if f.GetHelp() == "" {
			t.Errorf("family %s has no help", name)
		}
	}
	if own != 17 {
		t.Errorf("found %d rds_csi_ families, want 17 (update this test when adding one)", own)
	}
	lintFamilies(t, families, Namespace+"_")
}

func TestLabelValuesStayBounded(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"short result", "already-published", "already-published"},
		{"error message", "rpc error: code = Unavailable desc = RDS down", Other},
		{"upper case", "Attached", Other},
		{"empty", "", Other},
		{"too long", strings.Repeat("a", 41), Other},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := label(tc.in); got != tc.want {
				t.Errorf("label(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
	commands := []struct{ in, want string }{
		{"/disk add", "disk_add"},
		{"disk print", "disk_print"},
		{"disk_add", "disk_add"},
		{" /system resource print ", "system_resource_print"},
		{"/disk add type=file file-path=/storage-pool/pvc-1.img file-size=10G slot=pvc-1 nvme-tcp-export=yes", "disk_add"},
		{"/disk add copy-from=[find slot=pvc-1] type=file file-path=/storage-pool/snap.img", "disk_add"},
		{"/disk remove [find slot=pvc-1]", "disk_remove"},
		{"/disk set [find slot=pvc-1] file-size=20G", "disk_set"},
		{"/disk print detail where slot=pvc-1", "disk_print"},
		{"/file print detail where name=\"storage-pool/pvc-1.img\"", "file_print"},
		{"/disk print terse without-paging", "disk_print"},
		{"/a b c d", "a_b_c"},
		{"", Other},
		{"[find]", Other},
		{"pvc-0123456789abcdef0123456789abcdef0123456789", Other},
	}
	for _, tc := range commands {
		if got := commandLabel(tc.in); got != tc.want {
			t.Errorf("commandLabel(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}

	// A free-form fence reason is recorded as "other", not as a new series.
	m := New()
	m.Fenced(fencing.FenceReason("node went away: see logs"))
	byName := gather(t, m)
	if got, err := value(byName, "rds_csi_fences_total", map[string]string{"reason": Other}); err != nil || got != 1 {
		t.Errorf("fences{reason=other} = %v (%v), want 1", got, err)
	}
	if n := len(byName["rds_csi_fences_total"].GetMetric()); n != 6 {
		t.Errorf("fences_total has %d series, want 6 (five reasons and other)", n)
	}
}

func TestTwoInstancesAreIndependent(t *testing.T) {
	a, b := New(), New()
	a.SetLeader(true)
	a.Conflict()
	fb := gather(t, b)
	for _, name := range []string{"rds_csi_leader", "rds_csi_attach_conflicts_total"} {
		if got, err := value(fb, name, map[string]string{}); err != nil || got != 0 {
			t.Errorf("second instance: %s = %v (%v), want 0", name, got, err)
		}
	}
}

// The RDS client's count of unreadable listing entries is scraped as a
// counter, read at scrape time.
func TestUnreadableEntriesCounter(t *testing.T) {
	m := New()
	var n int64 = 3
	m.CountUnreadableEntries("rack-a", func() int64 { return n })
	m.CountUnreadableEntries("rack-b", func() int64 { return 11 })
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range families {
		byName[f.GetName()] = f
	}
	if v, err := value(byName, "rds_csi_rds_unreadable_entries_total", map[string]string{"rds": "rack-b"}); err != nil || v != 11 {
		t.Fatalf("rack-b's rds_csi_rds_unreadable_entries_total = %v, %v; want 11", v, err)
	}
	if v, err := value(byName, "rds_csi_rds_unreadable_entries_total", map[string]string{"rds": "rack-a"}); err != nil || v != 3 {
		t.Fatalf("rds_csi_rds_unreadable_entries_total = %v, %v; want 3", v, err)
	}
	n = 5
	families, _ = m.Registry().Gather()
	for _, f := range families {
		byName[f.GetName()] = f
	}
	if v, _ := value(byName, "rds_csi_rds_unreadable_entries_total", map[string]string{"rds": "rack-a"}); v != 5 {
		t.Fatalf("after two more skipped entries: %v, want 5", v)
	}
}

// lintFamilies fails t for every promlint problem of a family whose name
// starts with prefix.
func lintFamilies(t *testing.T, families []*dto.MetricFamily, prefix string) {
	t.Helper()
	problems, err := promlint.NewWithMetricFamilies(families).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, prefix) {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
}
