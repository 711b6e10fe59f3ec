// Package rulecheck runs labkeep's alert rules through Prometheus's own
// rule parser and promql engine. It is a module of its own so Prometheus's
// large dependency tree stays out of labkeep's go.mod; infra/monitoring's
// TestRulesParseAndFire runs it with the files to check.
package rulecheck

import (
	"log/slog"
	"os"
	"strings"
	"testing"

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
	rulesPath, casesPath := os.Getenv("LABKEEP_RULES"), os.Getenv("LABKEEP_ALERT_CASES")
	if rulesPath == "" || casesPath == "" {
		t.Fatal("LABKEEP_RULES and LABKEEP_ALERT_CASES must name the rules and the cases (run infra/monitoring's tests)")
	}
	groups, errs := rulefmt.ParseFile(rulesPath, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("rules: %v", err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
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
