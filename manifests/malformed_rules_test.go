package manifests

import (
	"testing"
)

// TestMalformedObjectsAlert: RDSCSIMalformedObjects fires, per kind and
// reason, once a replica has counted an unreadable PV for 10 minutes
// (both replicas count it: one alert, not two), and not for a PV fixed
// within that time, nor at zero.
func TestMalformedObjectsAlert(t *testing.T) {
	promtool := needPromtool(t)
	_, groups := alertExprs(t)
	claims := `kind="PersistentVolume",reason="unreadable-claims"`
	retiring := `kind="PersistentVolume",reason="unreadable-retiring"`
	fires := firing(t, groups, "RDSCSIMalformedObjects", map[string]string{"severity": "warning", "kind": "PersistentVolume", "reason": "unreadable-claims"})
	promtoolTest(t, promtool, groups, promAlertFile{
		RuleFiles:          []string{"rules.yaml"},
		EvaluationInterval: "1m",
		Tests: []promAlertGroup{
			{promTestGroup: promTestGroup{Name: "unreadable claims on two replicas; a retiring record fixed in 5 minutes", Interval: "1m",
				InputSeries: []promSeries{
					{Series: `rds_csi_malformed_objects{` + claims + `,pod="a"}`, Values: "0 2x30"},
					{Series: `rds_csi_malformed_objects{` + claims + `,pod="b"}`, Values: "0 0 2x30"},
					{Series: `rds_csi_malformed_objects{` + retiring + `,pod="a"}`, Values: "0 1x5 0x25"},
					{Series: `rds_csi_malformed_objects{` + retiring + `,pod="b"}`, Values: "0 1x5 0x25"},
				}},
				AlertRuleTests: []promAlertTest{
					{EvalTime: "5m", Alertname: "RDSCSIMalformedObjects"},
					{EvalTime: "20m", Alertname: "RDSCSIMalformedObjects", ExpAlerts: []promAlert{fires}},
				}},
			{promTestGroup: promTestGroup{Name: "nothing malformed", Interval: "1m",
				InputSeries: []promSeries{
					{Series: `rds_csi_malformed_objects{` + claims + `,pod="a"}`, Values: "0x30"},
					{Series: `rds_csi_malformed_objects{` + retiring + `,pod="a"}`, Values: "0x30"},
				}},
				AlertRuleTests: []promAlertTest{{EvalTime: "30m", Alertname: "RDSCSIMalformedObjects"}}},
		},
	})
}
