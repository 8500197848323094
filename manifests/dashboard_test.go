package manifests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/srvlab/rds-csi/pkg/metrics"
)

// dashboardFile is the Grafana dashboard of the RDS's health and load.
const dashboardFile = "monitoring/rds-csi-dashboard.json"

type dashboardPanel struct {
	ID         int              `json:"id"`
	Type       string           `json:"type"`
	Title      string           `json:"title"`
	Datasource *json.RawMessage `json:"datasource"`
	GridPos    *struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"` // of a collapsed row
}

// TestDashboard: the dashboard parses, every panel has an id of its own,
// a place and (but rows) a query; every query names only families the
// driver exports; with promtool installed every query parses as PromQL.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title      string           `json:"title"`
		UID        string           `json:"uid"`
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name, Type, Definition string
			} `json:"list"`
		} `json:"templating"`
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	// The datasource, and the RDS box selector (issue 36): the boxes the
	// connection gauge names.
	if d.Title == "" || d.UID == "" || len(d.Templating.List) != 2 || d.Templating.List[0].Type != "datasource" ||
		d.Templating.List[1].Name != "rds" || d.Templating.List[1].Definition != "label_values(rds_csi_rds_ssh_connected, rds)" {
		t.Errorf("title %q, uid %q, templating %+v: want a title, a uid, the datasource variable and the rds variable", d.Title, d.UID, d.Templating.List)
	}
	known := map[string]bool{}
	m := metrics.New()
	m.ObserveRDSCommand("rds-a", "disk print", time.Millisecond, nil)
	m.AddRDS("rds-a")
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		known[f.GetName()] = true
	}
	for name := range rdsHealthFamilies(t) {
		known[name] = true
	}
	var exprs []string
	ids := map[int]bool{}
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			if ids[p.ID] || p.ID == 0 {
				t.Errorf("panel %q: id %d missing or used twice", p.Title, p.ID)
			}
			ids[p.ID] = true
			if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 || p.Datasource == nil || !strings.Contains(string(*p.Datasource), "${datasource}") {
				t.Errorf("panel %q: no query, or not on the datasource variable", p.Title)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q: empty query %s", p.Title, tg.RefID)
					continue
				}
				names := metricName.FindAllString(tg.Expr, -1)
				if len(names) == 0 {
					t.Errorf("panel %q: query %q names no rds_csi_ metric", p.Title, tg.Expr)
				}
				for _, n := range names {
					if !known[n] {
						t.Errorf("panel %q: %s is not a family the driver exports", p.Title, n)
					}
				}
				// Every series a panel reads is of the boxes selected.
				if got, want := strings.Count(tg.Expr, `{rds=~"$rds"}`)+strings.Count(tg.Expr, `,rds=~"$rds"}`), len(names); got != want {
					t.Errorf("panel %q: %d of the %d metrics in %q select rds=~\"$rds\"", p.Title, got, want, tg.Expr)
				}
				exprs = append(exprs, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	if len(exprs) < 10 {
		t.Errorf("%d queries: the dashboard has the pool, the array and the top volumes", len(exprs))
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool is not installed (Debian package prometheus): the queries' PromQL was not parsed")
		return
	}
	var rules []map[string]string
	for i, e := range exprs {
		rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query_%d", i), "expr": e})
	}
	out, err := yaml.Marshal(map[string]any{"groups": []map[string]any{{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(file, out, 0o600); err != nil {
		t.Fatal(err)
	}
	if res, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s", err, res)
	}
}
