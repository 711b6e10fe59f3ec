// Package monitoring_test checks the monitoring kit (infra/monitoring):
// the dashboard and the alert rules reference only series labkeep
// exports, the rules pass Prometheus's own rule parser, and each alert's
// expression fires on series that produce its condition and stays quiet on
// series that do not (testdata/alerts.promqltest, run by Prometheus's
// promql engine in the testdata/rulecheck module).
package monitoring_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"labkeep/functions/app"
	"labkeep/infra/monitoring"
	"labkeep/shared/httpapi"
)

// describer is a Registerer that only records the names of what is
// registered with it, for series that have no sample yet.
type describer struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
		}
	}
	return nil
}

func (d describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d describer) Unregister(prometheus.Collector) bool { return false }

// exported is every labkeep_ series the functions register (app.Build
// registers app.Series's and httpapi's), histograms with their _bucket,
// _sum and _count.
func exported() map[string]bool {
	d := describer{names: map[string]bool{}}
	app.Series(d)
	httpapi.NewHTTPMetrics(d)
	for n := range d.names {
		if strings.HasSuffix(n, "_seconds") {
			d.names[n+"_bucket"], d.names[n+"_sum"], d.names[n+"_count"] = true, true, true
		}
	}
	return d.names
}

var seriesName = regexp.MustCompile(`\blabkeep_[a-z_]+`)

// unknown lists the labkeep_ names in expr that labkeep does not export.
func unknown(expr string, names map[string]bool) []string {
	var out []string
	for _, n := range seriesName.FindAllString(expr, -1) {
		if !names[n] {
			out = append(out, n)
		}
	}
	return out
}

type rule struct {
	Alert, Expr, For string
}

type promRule struct {
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []rule `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

func readRules(t *testing.T) (promRule, []byte) {
	t.Helper()
	groups, err := monitoring.RuleGroups()
	if err != nil {
		t.Fatal(err)
	}
	var pr promRule
	if err := yaml.Unmarshal(groups, &pr.Spec); err != nil {
		t.Fatal(err)
	}
	return pr, groups
}

func TestDashboardLoadsAndReferencesRealSeries(t *testing.T) {
	data, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard.json: title %q, uid %q, %d panels; want all set", d.Title, d.UID, len(d.Panels))
	}
	names := exported()
	used := map[string]bool{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			if bad := unknown(tg.Expr, names); len(bad) > 0 {
				t.Errorf("panel %q: %s references %v, which labkeep does not export", p.Title, tg.Expr, bad)
			}
			for _, n := range seriesName.FindAllString(tg.Expr, -1) {
				used[n] = true
			}
		}
	}
	for _, must := range []string{"labkeep_sessions", "labkeep_session_opens_total", "labkeep_http_request_duration_seconds_bucket", "labkeep_reap_runs_total"} {
		if !used[must] {
			t.Errorf("no panel shows %s", must)
		}
	}
}

// The alerts the kit promises, each over series labkeep exports.
func TestRulesReferenceRealSeries(t *testing.T) {
	pr, _ := readRules(t)
	names := exported()
	var alerts []string
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if bad := unknown(r.Expr, names); len(bad) > 0 {
				t.Errorf("%s: %s references %v, which labkeep does not export", r.Alert, r.Expr, bad)
			}
		}
	}
	slices.Sort(alerts)
	want := []string{"LabkeepCapacityExhausted", "LabkeepLabCatalogRefused", "LabkeepProvisioningFailing", "LabkeepReaperFailing", "LabkeepReaperStalled"}
	if !slices.Equal(want, alerts) {
		t.Errorf("alerts = %v, want %v", alerts, want)
	}
}

// The rules pass Prometheus's rule parser, and every alert's expression
// is evaluated by Prometheus's promql engine over the series of
// testdata/alerts.promqltest: where its condition is produced it returns
// the alert's sample, elsewhere nothing. Prometheus's module is too heavy
// for labkeep's go.mod, so this runs the small module in
// testdata/rulecheck (its go.sum pins it; the first run downloads it
// through the module proxy).
func TestRulesParseAndFire(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Prometheus's promql engine; skipped with -short")
	}
	_, groups := readRules(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, groups, 0o644); err != nil {
		t.Fatal(err)
	}
	cases, err := filepath.Abs(filepath.Join("testdata", "alerts.promqltest"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "test", "-count=1", "-v", "-run", "^TestAlerts$", ".")
	cmd.Dir = filepath.Join("testdata", "rulecheck")
	cmd.Env = append(os.Environ(), "LABKEEP_RULES="+rules, "LABKEEP_ALERT_CASES="+cases, "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	t.Logf("rulecheck:\n%s", out)
	if err != nil {
		t.Fatalf("rulecheck: %v", err)
	}
}
