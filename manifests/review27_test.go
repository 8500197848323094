//go:build review27

package manifests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Review of issue 27 (outside reviewer): holes in the health alerts.

// HOLE (with --rds-health-interval at 5m or more, which the flag allows up
// to 1h, RDSCSIRDSHealthPartFailing can never fire: its threshold is more
// than 3 failures in 15 minutes, and such a leader polls at most 3 times in
// 15 minutes. A `/disk print stats detail` that RouterOS refuses at every
// poll (the command is assumed, docs/routeros.md) then loses every
// volume's I/O and every drive's S.M.A.R.T. values, so RDSCSIRDSDriveHot,
// the critical-warning arm of RDSCSIRDSDriveFailing and the queue-depth
// alert go silent, and nothing says so; staleness stays below one
// interval because the disks part succeeds):
// input: interval 600s, poll_errors_total{part="stats"} +1 every 10
// minutes for 3 hours (every poll fails); the control, pool_traffic at a
// 30s interval failing every poll, fires.
func TestReview27PartFailingFiresAtLongIntervals(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed")
	}
	exprs, groups := alertExprs(t)
	expr := exprs["RDSCSIRDSHealthPartFailing"]
	if expr == "" {
		t.Fatal("alert RDSCSIRDSHealthPartFailing is missing")
	}
	dir := t.TempDir()
	rules, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	// One sample a minute for 3 hours: the stats part's counter grows by
	// one every 10 minutes (a failed poll each interval).
	var stats []string
	for i := 0; i <= 180; i++ {
		stats = append(stats, strconv.Itoa(i/10))
	}
	leader := `pod="rds-csi-controller-0"`
	file := promTestFile{
		RuleFiles:          []string{"rules.yaml"},
		EvaluationInterval: "1m",
		Tests: []promTestGroup{{
			Name: "review27 part failing", Interval: "1m",
			InputSeries: []promSeries{
				{Series: `rds_csi_rds_health_poll_errors_total{part="stats",` + leader + `}`, Values: strings.Join(stats, " ")},
				{Series: `rds_csi_rds_health_poll_interval_seconds{` + leader + `}`, Values: "600x180"},
				{Series: `rds_csi_rds_health_staleness_seconds{` + leader + `}`, Values: "0x180"},
				{Series: `rds_csi_rds_health_poll_errors_total{part="pool_traffic",pod="other"}`, Values: "0+2x180"},
			},
			ExprTests: []promExprTest{{
				Expr:     "count by (part) (" + expr + ")",
				EvalTime: "3h",
				ExpSamples: []promSample{
					{Labels: `{part="pool_traffic"}`, Value: 1},
					{Labels: `{part="stats"}`, Value: 1},
				},
			}},
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
		t.Errorf("a part failing at every poll of a 10m interval raises no alert: promtool test rules: %v\n%s", err, out)
	}
}

// HOLE (a leader that polls nothing raises no alert: its poller never
// starts when the attachment index does not sync (pollRDSHealth waits for
// it), and then every replica reports rds_csi_rds_health_polling 0 with no
// staleness series, so RDSCSIRDSHealthPollFailing has nothing to compare and
// the array, drive and pool alerts have no series: a degraded array goes
// unseen with every rule of the rds-csi.rds-health group quiet):
// input: for 1h the leader (rds_csi_leader 1) and the other replica both
// report rds_csi_rds_health_polling 0 and zero poll errors; the union of
// the group's alert expressions is evaluated.
func TestReview27NoReplicaPollingAlerts(t *testing.T) {
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
	dir := t.TempDir()
	rules, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	var series []promSeries
	for _, pod := range []string{"rds-csi-controller-0", "rds-csi-controller-1"} {
		leader := "0x60"
		if pod == "rds-csi-controller-0" {
			leader = "1x60"
		}
		series = append(series,
			promSeries{Series: `rds_csi_leader{pod="` + pod + `"}`, Values: leader},
			promSeries{Series: `rds_csi_rds_health_polling{pod="` + pod + `"}`, Values: "0x60"})
		for _, part := range []string{"disks", "stats", "pool_traffic"} {
			series = append(series, promSeries{Series: `rds_csi_rds_health_poll_errors_total{part="` + part + `",pod="` + pod + `"}`, Values: "0x60"})
		}
	}
	file := promTestFile{
		RuleFiles:          []string{"rules.yaml"},
		EvaluationInterval: "1m",
		Tests: []promTestGroup{{
			Name: "review27 nobody polls", Interval: "1m", InputSeries: series,
			ExprTests: []promExprTest{{
				Expr:       "count(" + strings.Join(exprs, " or ") + ")",
				EvalTime:   "1h",
				ExpSamples: []promSample{{Labels: `{}`, Value: 1}},
			}},
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
		t.Errorf("a leader that has not polled for an hour raises no RDS health alert: promtool test rules: %v\n%s", err, out)
	}
}
