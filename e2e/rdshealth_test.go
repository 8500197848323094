//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/srvlab/rds-csi/e2e/framework"
	"github.com/srvlab/rds-csi/pkg/diagnose"
)

// TestRDSHealthAlertFires: the simulator degrades its RAID (a drive
// failed, over the fault control protocol), and on the driver's own
// /metrics, as the leader polled it, the alerts' expressions
// (manifests/monitoring/prometheusrule.yaml, evaluated by promtool)
// become true for that array and drive, where they were false on the
// healthy array; kubectl rds check reports both, from the same endpoint.
func TestRDSHealthAlertFires(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed (Debian package prometheus): the alerts' expressions cannot be evaluated")
	}
	e := framework.NewEnv(t, framework.EnvOptions{})
	ctx, tl := e.Ctx, e.TL
	sim := e.StartSim(framework.SimOptions{})
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	e.StartController(sim, framework.ControllerOptions{NoAttacher: true,
		DriverArgs: []string{"--http-endpoint=127.0.0.1:" + strconv.Itoa(port), "--rds-health-interval=5s"}})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	alerts := alertRules(t, e.Root)

	done := tl.Step("the leader's first health poll: the array is healthy, no alert")
	var families map[string]*dto.MetricFamily
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "rds_csi_rds_array_degraded on /metrics", func(ctx context.Context) (bool, string, error) {
		families, err = scrapeMetrics(ctx, base+"/metrics")
		if err != nil {
			return false, err.Error(), nil
		}
		_, ok := families["rds_csi_rds_array_degraded"]
		return ok, "no health series yet", nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"RDSCSIRDSArrayDegraded", "RDSCSIRDSDriveFailing"} {
		if got := evalAlert(t, promtool, alerts[a], families); len(got) != 0 {
			t.Errorf("%s on the healthy array: %v", a, got)
		}
	}
	done()

	done = tl.Step("rds-sim: drive nvme2 fails; the alerts' expressions become true on the next poll")
	if err := sim.ArmFault(ctx, tl, "drive fail=nvme2"); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitFor(ctx, tl, time.Minute, "rds_csi_rds_array_degraded 1", func(ctx context.Context) (bool, string, error) {
		families, err = scrapeMetrics(ctx, base+"/metrics")
		if err != nil {
			return false, err.Error(), nil
		}
		for _, m := range families["rds_csi_rds_array_degraded"].GetMetric() {
			if m.GetGauge().GetValue() == 1 {
				return true, "", nil
			}
		}
		return false, "not degraded yet", nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := evalAlert(t, promtool, alerts["RDSCSIRDSArrayDegraded"], families), []string{`{array="raid1", rds="` + framework.RDSName + `"} 1`}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("RDSCSIRDSArrayDegraded: %v, want %v", got, want)
	}
	if got, want := evalAlert(t, promtool, alerts["RDSCSIRDSDriveFailing"], families), []string{`{drive="nvme2", rds="` + framework.RDSName + `"} 1`}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("RDSCSIRDSDriveFailing: %v, want %v", got, want)
	}
	done()

	done = tl.Step("kubectl rds check reports the degraded array and the failed drive")
	transcript, err := os.Create(filepath.Join(e.Dir, "kubectl-rds.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer transcript.Close()
	k := &kubectlRDS{t: t, tl: tl, bin: plugin.Path(t, tl, e.Root), kubeconfig: operatorKubeconfig(t, e), inventoryURL: base + "/inventory", transcript: transcript}
	code, r := k.check()
	if code != 1 || r.Counts[diagnose.FindingArrayDegraded] != 1 || r.Counts[diagnose.FindingDriveFailing] != 1 {
		t.Errorf("check: exit %d, %+v", code, r)
	}
	for _, f := range r.Findings {
		if f.Kind == diagnose.FindingArrayDegraded && f.Object != "rds/raid1" {
			t.Errorf("finding %+v", f)
		}
	}
	done()
}

// alertRules reads the PrometheusRule's alert expressions by name.
func alertRules(t *testing.T, root string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "manifests", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					Expr  string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &pr); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			out[r.Alert] = r.Expr
		}
	}
	return out
}

func scrapeMetrics(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

var e2eMetricName = regexp.MustCompile(`\brds_csi_[a-z0-9_]+`)

// evalAlert evaluates an alert's expression with promtool over the
// scraped samples of the families it names, held for 15 minutes as the
// leader reports them, and returns the result at the end as sorted
// `{labels} value` strings (promtool's unit-test format prints what it
// got when it differs from an expectation of nothing).
func evalAlert(t *testing.T, promtool, expr string, families map[string]*dto.MetricFamily) []string {
	t.Helper()
	if expr == "" {
		t.Fatal("no such alert")
	}
	type series struct {
		Series string `json:"series"`
		Values string `json:"values"`
	}
	var input []series
	for _, name := range e2eMetricName.FindAllString(expr, -1) {
		for _, m := range families[name].GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			input = append(input, series{Series: name + "{" + strings.Join(labels, ",") + "}", Values: strconv.FormatFloat(v, 'f', -1, 64) + "x15"})
		}
	}
	dir := t.TempDir()
	rules, _ := yaml.Marshal(map[string]any{"groups": []map[string]any{{"name": "none", "rules": []any{}}}})
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	test, _ := yaml.Marshal(map[string]any{"rule_files": []string{"rules.yaml"}, "evaluation_interval": "1m",
		"tests": []map[string]any{{"interval": "1m", "input_series": input,
			"promql_expr_test": []map[string]any{{"expr": expr, "eval_time": "10m", "exp_samples": []any{}}}}}})
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), test, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", "test.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	// "got: {array="raid1"} 1E+00, {...} ..." after "exp: (empty)".
	_, got, ok := strings.Cut(string(out), "got: ")
	if !ok {
		t.Fatalf("promtool: %v\n%s", err, out)
	}
	got, _, _ = strings.Cut(got, "\n")
	var samples []string
	for _, s := range regexp.MustCompile(`(\{[^}]*\}) ([0-9.Ee+-]+)`).FindAllStringSubmatch(got, -1) {
		v, _ := strconv.ParseFloat(s[2], 64)
		samples = append(samples, s[1]+" "+strconv.FormatFloat(v, 'f', -1, 64))
	}
	sort.Strings(samples)
	return samples
}
