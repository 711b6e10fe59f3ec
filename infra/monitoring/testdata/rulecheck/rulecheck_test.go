// Package rulecheck runs labkeep's alert rules through Prometheus's own
// rule parser and promql engine. It is a module of its own so Prometheus's
// large dependency tree stays out of labkeep's go.mod; infra/monitoring's
// TestRulesParseAndFire runs it with the files to check.
package rulecheck

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
)

// TestAlerts parses LABKEEP_RULES (a rule groups file) and runs the
// promqltest script LABKEEP_ALERT_CASES with every ALERT(name) replaced by
// that alert's expression. Every alert must be evaluated at least twice:
// where its condition is produced (the script expects its sample) and
// where it is not (the script expects nothing).
func TestAlerts(t *testing.T) {
	casesPath := os.Getenv("LABKEEP_ALERT_CASES")
	if casesPath == "" {
		t.Fatal("LABKEEP_ALERT_CASES must name the cases (run infra/monitoring's tests)")
	}
	groups := parseRules(t)
	script, err := os.ReadFile(casesPath)
	if err != nil {
		t.Fatal(err)
	}
	text := string(script)
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			placeholder := "ALERT(" + r.Alert + ")"
			if c := strings.Count(text, placeholder); c < 2 {
				t.Errorf("%s is evaluated %d times; the cases must show where it fires and where it stays quiet", r.Alert, c)
			}
			text = strings.ReplaceAll(text, placeholder, r.Expr)
		}
	}
	if i := strings.Index(text, "ALERT("); i >= 0 {
		t.Fatalf("cases name an alert the rules do not have: %.60s", text[i:])
	}
	t.Logf("%d alerts parsed; running their cases", n)
	promqltest.RunTest(t, text, promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery))
}

// parseRules parses LABKEEP_RULES, a rule groups file, with Prometheus's
// rule parser.
func parseRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	rulesPath := os.Getenv("LABKEEP_RULES")
	if rulesPath == "" {
		t.Fatal("LABKEEP_RULES must name the rule groups file")
	}
	groups, errs := rulefmt.ParseFile(rulesPath, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("rules: %v", err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	return groups
}

// TestAlertsOnScrapes evaluates every alert over real scrapes:
// LABKEEP_SCRAPES is a directory of /metrics answers 0.prom, 1.prom, …
// taken one minute apart (as Prometheus would store them), and
// LABKEEP_FIRING the comma-separated alerts that must fire at the last
// scrape; every other alert must be quiet there. Counters and gauges are
// loaded; histograms are not (no alert reads them).
func TestAlertsOnScrapes(t *testing.T) {
	dir, firing := os.Getenv("LABKEEP_SCRAPES"), strings.FieldsFunc(os.Getenv("LABKEEP_FIRING"), func(r rune) bool { return r == ',' })
	if dir == "" {
		t.Fatal("LABKEEP_SCRAPES must name the directory of scrapes")
	}
	groups := parseRules(t)
	series := map[string][]string{}
	n := 0
	for ; ; n++ {
		f, err := os.Open(filepath.Join(dir, fmt.Sprintf("%d.prom", n)))
		if os.IsNotExist(err) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := p.TextToMetricFamilies(f)
		f.Close()
		if err != nil {
			t.Fatalf("%d.prom: %v", n, err)
		}
		for name, mf := range mfs {
			for _, m := range mf.GetMetric() {
				var v float64
				switch mf.GetType() {
				case dto.MetricType_COUNTER:
					v = m.GetCounter().GetValue()
				case dto.MetricType_GAUGE:
					v = m.GetGauge().GetValue()
				default:
					continue
				}
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				key := name + "{" + strings.Join(labels, ",") + "}"
				for len(series[key]) < n {
					series[key] = append(series[key], "_")
				}
				series[key] = append(series[key], fmt.Sprint(v))
			}
		}
	}
	if n < 2 {
		t.Fatalf("%d scrapes in %s; an increase needs at least 2", n, dir)
	}
	var load strings.Builder
	load.WriteString("load 1m\n")
	for key, values := range series {
		for len(values) < n {
			values = append(values, "_")
		}
		fmt.Fprintf(&load, "  %s %s\n", key, strings.Join(values, " "))
	}
	storage := promqltest.LoadedStorage(t, load.String())
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	at := time.Unix(0, 0).Add(time.Duration(n-1) * time.Minute)
	var got []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			q, err := engine.NewInstantQuery(context.Background(), storage, nil, r.Expr, at)
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			res := q.Exec(context.Background())
			if res.Err != nil {
				t.Fatalf("%s: %v", r.Alert, res.Err)
			}
			vec, err := res.Vector()
			if err != nil {
				t.Fatalf("%s: %v", r.Alert, err)
			}
			t.Logf("%s at scrape %d: %v", r.Alert, n-1, vec)
			if len(vec) > 0 {
				got = append(got, r.Alert)
			}
			q.Close()
		}
	}
	slices.Sort(got)
	slices.Sort(firing)
	if !slices.Equal(firing, got) {
		t.Errorf("firing at the last scrape: %v, want %v", got, firing)
	}
}
