package manifests

import (
	"os"
	"os/exec"
	"path/filepath"
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
	m.ReportRDSHealth(func() rdshealth.View { return view })
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
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian package prometheus); TestPrometheusRules still checked the rules statically")
	}
	exprs, groups := alertExprs(t)
	expr := func(alert string) string {
		t.Helper()
		if exprs[alert] == "" {
			t.Fatalf("alert %s is missing or has no expr", alert)
		}
		return exprs[alert]
	}
	dir := t.TempDir()
	rules, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	series := func(s, v string) promSeries { return promSeries{Series: s, Values: v} }
	none := []promSample{}
	leader := `pod="rds-csi-controller-0"`
	file := promTestFile{
		RuleFiles:          []string{"rules.yaml"},
		EvaluationInterval: "1m",
		Tests: []promTestGroup{{
			Name: "rds health", Interval: "1m",
			InputSeries: []promSeries{
				series(`rds_csi_rds_array_degraded{array="raid1",`+leader+`}`, "0 0 1x20"),
				series(`rds_csi_rds_array_degraded{array="raid2",`+leader+`}`, "0x22"),
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
				series(`rds_csi_rds_health_poll_errors_total{part="stats",`+leader+`}`, "0+2x22"),
				series(`rds_csi_rds_health_poll_errors_total{part="pool_traffic",`+leader+`}`, "0 1x21"),
				series(`rds_csi_rds_health_poll_errors_total{part="disks",`+leader+`}`, "0+2x22"),
			},
			ExprTests: []promExprTest{
				{Expr: expr("RDSCSIRDSArrayDegraded"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{array="raid1"}`, Value: 1}}},
				{Expr: expr("RDSCSIRDSArrayDegraded"), EvalTime: "1m", ExpSamples: none},
				{Expr: expr("RDSCSIRDSDriveFailing"), EvalTime: "20m", ExpSamples: []promSample{
					{Labels: `{drive="nvme2"}`, Value: 1}, {Labels: `{drive="nvme3"}`, Value: 4}}},
				{Expr: expr("RDSCSIRDSDriveWornOut"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{drive="nvme1"}`, Value: 93}}},
				{Expr: expr("RDSCSIRDSDriveHot"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{drive="nvme1"}`, Value: 75}}},
				{Expr: expr("RDSCSIRDSPoolFilling"), EvalTime: "20m", ExpSamples: []promSample{
					{Labels: `{pool="fast"}`, Value: 0.97}, {Labels: `{pool="storage-pool"}`, Value: 0.9}}},
				{Expr: expr("RDSCSIRDSPoolFull"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{pool="fast"}`, Value: 0.97}}},
				{Expr: expr("RDSCSIRDSVolumeQueueDepthHigh"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{pv="pvc-busy"}`, Value: 24}}},
				{Expr: expr("RDSCSIRDSVolumeQueueDepthHigh"), EvalTime: "12m", ExpSamples: []promSample{{Labels: `{pv="pvc-busy"}`, Value: 24}}},
				{Expr: expr("RDSCSIRDSHealthPollFailing"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{__name__="rds_csi_rds_health_staleness_seconds",pod="failing"}`, Value: 1200}}},
				{Expr: expr("RDSCSIRDSHealthPartFailing"), EvalTime: "20m", ExpSamples: []promSample{{Labels: `{part="stats"}`, Value: 30}}},
			},
		}},
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
