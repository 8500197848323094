package manifests

import (
	"os/exec"
	"testing"

	"github.com/srvlab/rds-csi/pkg/csi"
)

// promtool's unit-test file format (promtool test rules).
type (
	promTestFile struct {
		RuleFiles          []string        `json:"rule_files"`
		EvaluationInterval string          `json:"evaluation_interval"`
		Tests              []promTestGroup `json:"tests"`
	}
	promTestGroup struct {
		Name        string         `json:"name"`
		Interval    string         `json:"interval"`
		InputSeries []promSeries   `json:"input_series"`
		ExprTests   []promExprTest `json:"promql_expr_test"`
	}
	promSeries struct {
		Series string `json:"series"`
		Values string `json:"values"`
	}
	promExprTest struct {
		Expr       string       `json:"expr"`
		EvalTime   string       `json:"eval_time"`
		ExpSamples []promSample `json:"exp_samples"`
	}
	promSample struct {
		Labels string  `json:"labels"`
		Value  float64 `json:"value"`
	}
)

// TestAlertsOnKubeStateMetrics evaluates the alerts' expressions with
// promtool on kube-state-metrics series for the cases they must tell
// apart: two Ready nodes (alert), a fenced NotReady node (no alert), a
// live migration (no alert), three nodes, another driver's volumes, a
// stuck attachment; and the driver's own leader and RDS gauges.
func TestAlertsOnKubeStateMetrics(t *testing.T) {
	promtool := needPromtool(t)
	exprs, groups := alertExprs(t)
	expr := func(alert string) string { return mustExpr(t, exprs, alert) }

	driver := `attacher="` + csi.DefaultDriverName + `"`
	series := func(s, v string) promSeries { return promSeries{Series: s, Values: v} }
	var ksm []promSeries
	node := func(name string, ready bool) {
		t, f := "1x15", "0x15"
		if !ready {
			t, f = f, t
		}
		ksm = append(ksm,
			series(`kube_node_status_condition{node="`+name+`",condition="Ready",status="true"}`, t),
			series(`kube_node_status_condition{node="`+name+`",condition="Ready",status="false"}`, f),
			series(`kube_node_status_condition{node="`+name+`",condition="Ready",status="unknown"}`, "0x15"))
	}
	va := func(name, pv, node, attacher string, attached bool) {
		a := "1x15"
		if !attached {
			a = "0x15"
		}
		ksm = append(ksm,
			series(`kube_volumeattachment_spec_source_persistentvolume{volumeattachment="`+name+`",volumename="`+pv+`"}`, "1x15"),
			series(`kube_volumeattachment_status_attached{volumeattachment="`+name+`"}`, a),
			series(`kube_volumeattachment_info{volumeattachment="`+name+`",node="`+node+`",`+attacher+`}`, "1x15"))
	}
	claim := func(name, pv, mode string) {
		ksm = append(ksm,
			series(`kube_persistentvolumeclaim_info{namespace="apps",persistentvolumeclaim="`+name+`",volumename="`+pv+`",storageclass="rds-nvme-block"}`, "1x15"),
			series(`kube_persistentvolumeclaim_access_mode{namespace="apps",persistentvolumeclaim="`+name+`",access_mode="`+mode+`"}`, "1x15"))
	}
	node("n1", true)
	node("n2", true)
	node("n3", false) // failed, its attachment fenced by the driver
	node("n4", true)
	claim("c1", "pv-1", "ReadWriteOnce") // on two Ready nodes: the danger
	va("va-1a", "pv-1", "n1", driver, true)
	va("va-1b", "pv-1", "n2", driver, true)
	claim("c2", "pv-2", "ReadWriteOnce") // moved off a failed node
	va("va-2a", "pv-2", "n1", driver, true)
	va("va-2b", "pv-2", "n3", driver, true)
	claim("c3", "pv-3", "ReadWriteMany") // live migration
	va("va-3a", "pv-3", "n1", driver, true)
	va("va-3b", "pv-3", "n2", driver, true)
	claim("c5", "pv-5", "ReadWriteMany") // three nodes: never right
	va("va-5a", "pv-5", "n1", driver, true)
	va("va-5b", "pv-5", "n2", driver, true)
	va("va-5c", "pv-5", "n4", driver, true)
	claim("c6", "pv-6", "ReadWriteOnce") // another driver's business
	va("va-6a", "pv-6", "n1", `attacher="other.csi.example.com"`, true)
	va("va-6b", "pv-6", "n2", `attacher="other.csi.example.com"`, true)
	claim("c4", "pv-4", "ReadWriteOnce") // refused by the driver: stuck
	va("va-4", "pv-4", "n4", driver, false)
	va("va-7", "pv-7", "n4", `attacher="other.csi.example.com"`, false)

	none := []promSample{}
	file := promTestFile{
		RuleFiles:          []string{"rules.yaml"},
		EvaluationInterval: "1m",
		Tests: []promTestGroup{
			{
				Name: "kube-state-metrics", Interval: "1m", InputSeries: ksm,
				ExprTests: []promExprTest{
					{Expr: expr("RDSCSIVolumeMultiAttach"), EvalTime: "10m", ExpSamples: []promSample{{Labels: `{volumename="pv-1"}`, Value: 2}}},
					{Expr: expr("RDSCSIVolumeAttachedToMoreThanTwoNodes"), EvalTime: "10m", ExpSamples: []promSample{{Labels: `{volumename="pv-5"}`, Value: 3}}},
					{Expr: expr("RDSCSIAttachmentStuck"), EvalTime: "10m", ExpSamples: []promSample{
						{Labels: `{volumeattachment="va-4",node="n4",` + driver + `,volumename="pv-4"}`, Value: 0}}},
				},
			},
			{
				Name: "no leader, RDS unreachable", Interval: "1m",
				InputSeries: []promSeries{
					series(`rds_csi_leader{pod="a"}`, "0x15"), series(`rds_csi_leader{pod="b"}`, "0x15"),
					series(`rds_csi_rds_ssh_connected{pod="a",rds="rds-a"}`, "0x15"), series(`rds_csi_rds_ssh_connected{pod="b",rds="rds-a"}`, "0x15"),
					// Another box both replicas reach: no alert for it.
					series(`rds_csi_rds_ssh_connected{pod="a",rds="rds-b"}`, "1x15"), series(`rds_csi_rds_ssh_connected{pod="b",rds="rds-b"}`, "0x15"),
					// One replica sees an orphaned claim, the other does not.
					series(`rds_csi_orphaned_claims{pod="a"}`, "1x15"), series(`rds_csi_orphaned_claims{pod="b"}`, "0x15"),
				},
				ExprTests: []promExprTest{
					{Expr: expr("RDSCSIControllerNoLeader"), EvalTime: "10m", ExpSamples: []promSample{{Labels: `{}`, Value: 0}}},
					{Expr: expr("RDSCSIRDSUnreachable"), EvalTime: "10m", ExpSamples: []promSample{{Labels: `{rds="rds-a"}`, Value: 0}}},
					{Expr: expr("RDSCSIOrphanedClaim"), EvalTime: "10m", ExpSamples: []promSample{{Labels: `{}`, Value: 1}}},
				},
			},
			{
				Name: "the mass-outage guard holds; nodes flap", Interval: "1m",
				InputSeries: []promSeries{
					// a holds for 10 minutes, then lets go; b never holds.
					series(`rds_csi_fence_guard_holding{pod="a"}`, "0 1x9 0x5"), series(`rds_csi_fence_guard_holding{pod="b"}`, "0x15"),
					// Three flaps within 30 minutes.
					series(`rds_csi_node_flaps_total{pod="a"}`, "0 0 1 1 2 2 3 3 3 3 3 3 3 3 3 3"),
				},
				ExprTests: []promExprTest{
					{Expr: expr("RDSCSIFencingGuardHolding"), EvalTime: "5m", ExpSamples: []promSample{{Labels: `{}`, Value: 1}}},
					{Expr: expr("RDSCSIFencingGuardHolding"), EvalTime: "12m", ExpSamples: none},
					{Expr: expr("RDSCSINodeFlapping"), EvalTime: "3m", ExpSamples: none},
					{Expr: expr("RDSCSINodeFlapping"), EvalTime: "10m", ExpSamples: []promSample{{Labels: `{}`, Value: 3}}},
				},
			},
			{
				Name: "one leader, one replica connected", Interval: "1m",
				InputSeries: []promSeries{
					series(`rds_csi_leader{pod="a"}`, "1x15"), series(`rds_csi_leader{pod="b"}`, "0x15"),
					series(`rds_csi_rds_ssh_connected{pod="a",rds="rds-a"}`, "0x15"), series(`rds_csi_rds_ssh_connected{pod="b",rds="rds-a"}`, "1x15"),
					series(`rds_csi_orphaned_claims{pod="a"}`, "0x15"), series(`rds_csi_orphaned_claims{pod="b"}`, "0x15"),
				},
				ExprTests: []promExprTest{
					{Expr: expr("RDSCSIControllerNoLeader"), EvalTime: "10m", ExpSamples: none},
					{Expr: expr("RDSCSIRDSUnreachable"), EvalTime: "10m", ExpSamples: none},
					{Expr: expr("RDSCSIOrphanedClaim"), EvalTime: "10m", ExpSamples: none},
				},
			},
		},
	}
	promtoolTest(t, promtool, groups, file)
}

// needPromtool is promtool's path; without it the test is skipped
// (TestPrometheusRules still checks the rules statically).
func needPromtool(t *testing.T) string {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian package prometheus); TestPrometheusRules still checked the rules statically")
	}
	return promtool
}

// mustExpr is alert's expression among exprs (alertExprs).
func mustExpr(t *testing.T, exprs map[string]string, alert string) string {
	t.Helper()
	if exprs[alert] == "" {
		t.Fatalf("alert %s is missing or has no expr", alert)
	}
	return exprs[alert]
}
