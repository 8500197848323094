package manifests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/srvlab/rds-csi/pkg/metrics"
	"github.com/srvlab/rds-csi/pkg/rds"
	"github.com/srvlab/rds-csi/pkg/rdshealth"
)

// rdsHealthFamilies are the families the RDS health collector exports
// (pkg/metrics/rdshealth.go), gathered from a leader's view in which every
// value is present; the collector reports them only while it polls.
func rdsHealthFamilies(t *testing.T) map[string]bool {
	t.Helper()
	f, n := 1.0, int64(1)
	all := rds.IOStats{Has: ^rds.IOField(0)}
	view := rdshealth.View{Polling: true, Interval: time.Minute, Errors: map[string]uint64{},
		Snapshot: &rdshealth.Snapshot{
			Arrays:  []rds.Array{{Slot: "raid1"}},
			Drives:  []rds.Drive{{Slot: "nvme1", Smart: rds.Smart{Temperature: &f, PercentageUsed: &f, CriticalWarning: &n, UnsafeShutdowns: &n}}},
			Pool:    &rds.Pool{Slot: "storage-pool"},
			PoolIO:  &all,
			Volumes: []rdshealth.Volume{{PV: "pv", IO: all}},
		}}
	m := metrics.New()
	m.ReportRDSHealth(metrics.RDSHealthSource{RDS: "rds-a", View: func() rdshealth.View { return view }})
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, fam := range families {
		if strings.HasPrefix(fam.GetName(), "rds_csi_rds_") {
			out[fam.GetName()] = true
		}
	}
	return out
}

// alertExprs are the alerts of the PrometheusRule by name, and its groups.
func alertExprs(t *testing.T) (map[string]string, []any) {
	t.Helper()
	s := load(t)
	pr := mustGet[*unstructured.Unstructured](t, s, "PrometheusRule", namespace, "rds-csi")
	groups, _, err := unstructured.NestedSlice(pr.Object, "spec", "groups")
	if err != nil {
		t.Fatal(err)
	}
	exprs := map[string]string{}
	for _, g := range groups {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			rule := r.(map[string]any)
			name, _ := rule["alert"].(string)
			exprs[name], _ = rule["expr"].(string)
		}
	}
	return exprs, groups
}

// TestRDSHealthRulesUseExportedMetrics: every rds_csi_rds_ name in the
// health alerts is a family the collector exports.
func TestRDSHealthRulesUseExportedMetrics(t *testing.T) {
	known := rdsHealthFamilies(t)
	exprs, _ := alertExprs(t)
	for name, expr := range exprs {
		for _, m := range metricName.FindAllString(expr, -1) {
			if strings.HasPrefix(m, "rds_csi_rds_") && m != "rds_csi_rds_ssh_connected" && !known[m] {
				t.Errorf("%s: uses %s, which the RDS health collector does not export", name, m)
			}
		}
	}
}

// TestRDSHealthAlerts evaluates the health alerts' expressions with
// promtool on the series the leader reports, for the cases each must tell
// apart: a degraded array and a healthy one; a failed drive, a drive with
// its critical warning set and a healthy one; a worn drive; a hot drive
// and a warm one; a pool 90 % full and one 97 % full; a volume whose queue
// stays deep and one with a spike; a leader whose polls fail and one whose
// polls succeed; a part that keeps failing and one that failed once.
func TestRDSHealthAlerts(t *testing.T) {
	promtool := needPromtool(t)
	exprs, groups := alertExprs(t)
	expr := func(alert string) string { return mustExpr(t, exprs, alert) }
	series := func(s, v string) promSeries { return promSeries{Series: s, Values: v} }
	none := []promSample{}
	leader := `pod="rds-csi-controller-0",rds="rds-a"`
	promtoolTest(t, promtool, groups, promTestFile{
		RuleFiles:          []string{"rules.yaml"},
		EvaluationInterval: "1m",
		Tests: []promTestGroup{{
			Name: "rds health", Interval: "1m",
			InputSeries: []promSeries{
				series(`rds_csi_rds_array_degraded{array="raid1",`+leader+`}`, "0 0 1x20"),
				series(`rds_csi_rds_array_degraded{array="raid2",`+leader+`}`, "0x22"),
				// The same array name on another box stays healthy: alerts are per box.
				series(`rds_csi_rds_array_degraded{array="raid1",pod="rds-csi-controller-0",rds="rds-b"}`, "0x22"),
				series(`rds_csi_rds_drive_failed{drive="nvme2",array="raid1",`+leader+`}`, "1x22"),
				series(`rds_csi_rds_drive_failed{drive="nvme3",array="raid1",`+leader+`}`, "0x22"),
				series(`rds_csi_rds_drive_failed{drive="nvme1",array="raid1",`+leader+`}`, "0x22"),
				series(`rds_csi_rds_drive_critical_warning{drive="nvme3",`+leader+`}`, "4x22"),
				series(`rds_csi_rds_drive_critical_warning{drive="nvme1",`+leader+`}`, "0x22"),
				series(`rds_csi_rds_drive_percentage_used{drive="nvme1",`+leader+`}`, "93x22"),
				series(`rds_csi_rds_drive_percentage_used{drive="nvme3",`+leader+`}`, "12x22"),
				series(`rds_csi_rds_drive_temperature_celsius{drive="nvme1",`+leader+`}`, "75x22"),
				series(`rds_csi_rds_drive_temperature_celsius{drive="nvme3",`+leader+`}`, "45x22"),
				series(`rds_csi_rds_pool_size_bytes{pool="storage-pool",`+leader+`}`, "1000x22"),
				series(`rds_csi_rds_pool_free_bytes{pool="storage-pool",`+leader+`}`, "100x22"),
				series(`rds_csi_rds_pool_size_bytes{pool="fast",`+leader+`}`, "1000x22"),
				series(`rds_csi_rds_pool_free_bytes{pool="fast",`+leader+`}`, "30x22"),
				series(`rds_csi_rds_pool_size_bytes{pool="empty",`+leader+`}`, "1000x22"),
				series(`rds_csi_rds_pool_free_bytes{pool="empty",`+leader+`}`, "900x22"),
				series(`rds_csi_rds_volume_in_flight_ops{pv="pvc-busy",`+leader+`}`, "24x22"),
				series(`rds_csi_rds_volume_in_flight_ops{pv="pvc-spike",`+leader+`}`, "0x10 200 0x11"),
				series(`rds_csi_rds_volume_in_flight_ops{pv="pvc-idle",`+leader+`}`, "0x22"),
				series(`rds_csi_rds_health_staleness_seconds{pod="failing"}`, "0+60x22"),
				series(`rds_csi_rds_health_poll_interval_seconds{pod="failing"}`, "30x22"),
				series(`rds_csi_rds_health_staleness_seconds{`+leader+`}`, "0 30 0 15 30 0x18"),
				series(`rds_csi_rds_health_poll_interval_seconds{`+leader+`}`, "30x22"),
				series(`rds_csi_rds_health_part_failed_polls{part="stats",`+leader+`}`, "2+2x22"),
				series(`rds_csi_rds_health_part_failed_polls{part="pool_traffic",`+leader+`}`, "1 0x21"),
				series(`rds_csi_rds_health_part_failed_polls{part="disks",`+leader+`}`, "2+2x22"),
			},
			ExprTests: []promExprTest{
				{Expr: expr("RDSCSIRDSArrayDegraded"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{array="raid1",rds="rds-a"}`, Value: 1}}},
				{Expr: expr("RDSCSIRDSArrayDegraded"), EvalTime: "1m", ExpSamples: none},
				{Expr: expr("RDSCSIRDSDriveFailing"), EvalTime: "20m", ExpSamples: []promSample{
					{Labels: `{drive="nvme2",rds="rds-a"}`, Value: 1}, {Labels: `{drive="nvme3",rds="rds-a"}`, Value: 4}}},
				{Expr: expr("RDSCSIRDSDriveWornOut"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{drive="nvme1",rds="rds-a"}`, Value: 93}}},
				{Expr: expr("RDSCSIRDSDriveHot"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{drive="nvme1",rds="rds-a"}`, Value: 75}}},
				{Expr: expr("RDSCSIRDSPoolFilling"), EvalTime: "20m", ExpSamples: []promSample{
					{Labels: `{pool="fast",rds="rds-a"}`, Value: 0.97}, {Labels: `{pool="storage-pool",rds="rds-a"}`, Value: 0.9}}},
				{Expr: expr("RDSCSIRDSPoolFull"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{pool="fast",rds="rds-a"}`, Value: 0.97}}},
				{Expr: expr("RDSCSIRDSVolumeQueueDepthHigh"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{pv="pvc-busy",rds="rds-a"}`, Value: 24}}},
				{Expr: expr("RDSCSIRDSVolumeQueueDepthHigh"), EvalTime: "12m", ExpSamples: []promSample{{Labels: `{pv="pvc-busy",rds="rds-a"}`, Value: 24}}},
				{Expr: expr("RDSCSIRDSHealthPollFailing"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{__name__="rds_csi_rds_health_staleness_seconds",pod="failing"}`, Value: 1200}}},
				{Expr: expr("RDSCSIRDSHealthPartFailing"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{part="stats",rds="rds-a"}`, Value: 42}}},
			},
		}},
	})
}

// promtoolTest runs `promtool test rules` on file, with the PrometheusRule's
// groups as its rules.yaml.
func promtoolTest(t *testing.T, promtool string, groups []any, file any) {
	t.Helper()
	dir := t.TempDir()
	rules, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	data, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
}

// promtool's alert tests beside its expression tests (the types of
// promtool_test.go, with alert_rule_test).
type (
	promAlertFile struct {
		RuleFiles          []string         `json:"rule_files"`
		EvaluationInterval string           `json:"evaluation_interval"`
		Tests              []promAlertGroup `json:"tests"`
	}
	promAlertGroup struct {
		promTestGroup
		AlertRuleTests []promAlertTest `json:"alert_rule_test,omitempty"`
	}
	promAlertTest struct {
		EvalTime  string      `json:"eval_time"`
		Alertname string      `json:"alertname"`
		ExpAlerts []promAlert `json:"exp_alerts"`
	}
	promAlert struct {
		ExpLabels      map[string]string `json:"exp_labels"`
		ExpAnnotations map[string]string `json:"exp_annotations,omitempty"`
	}
)

// firing is the alert promtool must report for the rule alertname with
// labels (severity included): its annotations are the rule's, their
// {{ $labels.x }} filled in from labels (annotations of the rules under
// test use no other template).
func firing(t *testing.T, groups []any, alertname string, labels map[string]string) promAlert {
	t.Helper()
	for _, g := range groups {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			rule := r.(map[string]any)
			if rule["alert"] != alertname {
				continue
			}
			ann := map[string]string{}
			for k, v := range rule["annotations"].(map[string]any) {
				text := v.(string)
				for l, lv := range labels {
					text = strings.ReplaceAll(text, "{{ $labels."+l+" }}", lv)
				}
				if strings.Contains(text, "{{") {
					t.Fatalf("%s: annotation %s has a template firing does not fill: %s", alertname, k, text)
				}
				ann[k] = text
			}
			return promAlert{ExpLabels: labels, ExpAnnotations: ann}
		}
	}
	t.Fatalf("alert %s is missing", alertname)
	return promAlert{}
}

// Found by the outside review of issue 27.

// TestRDSHealthPartFailingAnyInterval: a part that fails at every poll
// fires RDSCSIRDSHealthPartFailing at a 30s and at a 10m interval (the
// former rule, more than 3 failures in 15 minutes, never fired at 5m and
// beyond, which --rds-health-interval allows up to 1h); one that failed
// twice in a row and then succeeded does not, at either interval.
// The series are what the collector reports: the failed-polls gauge steps
// at each poll (every sample at 30s, every tenth minute at 10m).
func TestRDSHealthPartFailingAnyInterval(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed")
	}
	exprs, groups := alertExprs(t)
	expr := exprs["RDSCSIRDSHealthPartFailing"]
	if expr == "" {
		t.Fatal("alert RDSCSIRDSHealthPartFailing is missing")
	}
	// One sample a minute for 3 hours.
	var slowFailing, slowRecovered []string
	for i := 0; i <= 180; i++ {
		slowFailing = append(slowFailing, strconv.Itoa(i/10+1)) // a failed poll every 10 minutes
		n := i/10 + 1
		if n > 2 {
			n = 0 // the third poll succeeded
		}
		slowRecovered = append(slowRecovered, strconv.Itoa(n))
	}
	slow, fast := `pod="slow",rds="rds-a"`, `pod="fast",rds="rds-b"`
	promtoolTest(t, promtool, groups, promAlertFile{
		RuleFiles:          []string{"rules.yaml"},
		EvaluationInterval: "1m",
		Tests: []promAlertGroup{{
			promTestGroup: promTestGroup{Name: "part failing at 30s and at 10m", Interval: "1m",
				InputSeries: []promSeries{
					{Series: `rds_csi_rds_health_part_failed_polls{part="stats",` + slow + `}`, Values: strings.Join(slowFailing, " ")},
					{Series: `rds_csi_rds_health_part_failed_polls{part="pool_traffic",` + slow + `}`, Values: strings.Join(slowRecovered, " ")},
					{Series: `rds_csi_rds_health_poll_interval_seconds{` + slow + `}`, Values: "600x180"},
					{Series: `rds_csi_rds_health_part_failed_polls{part="pool_traffic",` + fast + `}`, Values: "2+2x180"},
					{Series: `rds_csi_rds_health_part_failed_polls{part="stats",` + fast + `}`, Values: "2 0x179"},
					{Series: `rds_csi_rds_health_poll_interval_seconds{` + fast + `}`, Values: "30x180"},
				},
				ExprTests: []promExprTest{
					{Expr: "count by (part, pod) (rds_csi_rds_health_part_failed_polls >= 3)", EvalTime: "3h", ExpSamples: []promSample{
						{Labels: `{part="pool_traffic",pod="fast"}`, Value: 1}, {Labels: `{part="stats",pod="slow"}`, Value: 1}}},
				}},
			AlertRuleTests: []promAlertTest{
				{EvalTime: "3h", Alertname: "RDSCSIRDSHealthPartFailing", ExpAlerts: []promAlert{
					firing(t, groups, "RDSCSIRDSHealthPartFailing", map[string]string{"severity": "warning", "part": "pool_traffic", "rds": "rds-b"}),
					firing(t, groups, "RDSCSIRDSHealthPartFailing", map[string]string{"severity": "warning", "part": "stats", "rds": "rds-a"}),
				}},
				// 10m: the third failed poll at 20m, firing 5m later;
				// 30s: firing since 6m.
				{EvalTime: "24m", Alertname: "RDSCSIRDSHealthPartFailing", ExpAlerts: []promAlert{
					firing(t, groups, "RDSCSIRDSHealthPartFailing", map[string]string{"severity": "warning", "part": "pool_traffic", "rds": "rds-b"})}},
				{EvalTime: "26m", Alertname: "RDSCSIRDSHealthPartFailing", ExpAlerts: []promAlert{
					firing(t, groups, "RDSCSIRDSHealthPartFailing", map[string]string{"severity": "warning", "part": "pool_traffic", "rds": "rds-b"}),
					firing(t, groups, "RDSCSIRDSHealthPartFailing", map[string]string{"severity": "warning", "part": "stats", "rds": "rds-a"})}},
			},
		}},
	})
}

// TestRDSHealthNotPollingAlerts: a leader whose poller never starts (its
// attachment index does not sync) leaves every replica at
// rds_csi_rds_health_polling 0 with no staleness series, so the group's
// other alerts have nothing to fire on: RDSCSIRDSHealthNotPolling fires
// after 15 minutes; with a replica polling, or no leader at all (another
// alert's case), it does not.
func TestRDSHealthNotPollingAlerts(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed")
	}
	_, groups := alertExprs(t)
	var exprs []string
	for _, g := range groups {
		if g.(map[string]any)["name"] != "rds-csi.rds-health" {
			continue
		}
		for _, r := range g.(map[string]any)["rules"].([]any) {
			if e, ok := r.(map[string]any)["expr"].(string); ok {
				exprs = append(exprs, "("+strings.TrimSpace(e)+")")
			}
		}
	}
	if len(exprs) == 0 {
		t.Fatal("no rules in group rds-csi.rds-health")
	}
	nobodyPolls := func(polling0, leader0 string) []promSeries {
		var series []promSeries
		for i, pod := range []string{"rds-csi-controller-0", "rds-csi-controller-1"} {
			leader, polling := "0x60", "0x60"
			if i == 0 {
				leader, polling = leader0, polling0
			}
			series = append(series,
				promSeries{Series: `rds_csi_leader{pod="` + pod + `"}`, Values: leader},
				promSeries{Series: `rds_csi_rds_health_polling{pod="` + pod + `",rds="rds-a"}`, Values: polling})
			for _, part := range []string{"disks", "stats", "pool_traffic"} {
				series = append(series, promSeries{Series: `rds_csi_rds_health_poll_errors_total{part="` + part + `",pod="` + pod + `"}`, Values: "0x60"})
			}
		}
		return series
	}
	union := "count(" + strings.Join(exprs, " or ") + ")"
	leads := []promAlert{firing(t, groups, "RDSCSIRDSHealthNotPolling", map[string]string{"severity": "warning", "rds": "rds-a"})}
	promtoolTest(t, promtool, groups, promAlertFile{
		RuleFiles:          []string{"rules.yaml"},
		EvaluationInterval: "1m",
		Tests: []promAlertGroup{
			{promTestGroup: promTestGroup{Name: "a leader, nobody polls", Interval: "1m", InputSeries: nobodyPolls("0x60", "1x60"),
				ExprTests: []promExprTest{{Expr: union, EvalTime: "1h", ExpSamples: []promSample{{Labels: `{}`, Value: 1}}}}},
				AlertRuleTests: []promAlertTest{
					{EvalTime: "1h", Alertname: "RDSCSIRDSHealthNotPolling", ExpAlerts: leads},
					{EvalTime: "10m", Alertname: "RDSCSIRDSHealthNotPolling"},
				}},
			{promTestGroup: promTestGroup{Name: "the leader polls", Interval: "1m", InputSeries: nobodyPolls("1x60", "1x60")},
				AlertRuleTests: []promAlertTest{{EvalTime: "1h", Alertname: "RDSCSIRDSHealthNotPolling"}}},
			{promTestGroup: promTestGroup{Name: "no leader", Interval: "1m", InputSeries: nobodyPolls("0x60", "0x60")},
				AlertRuleTests: []promAlertTest{{EvalTime: "1h", Alertname: "RDSCSIRDSHealthNotPolling"}}},
		},
	})
}
