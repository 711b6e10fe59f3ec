package session_test

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"labkeep/infra"
	"labkeep/infra/monitoring"
	"labkeep/localrun/stacktest"
)

// The alerts of infra/monitoring evaluated by Prometheus's promql engine
// over this deployment's own /metrics, scraped as Prometheus would (one
// scrape a minute): a student refused for capacity and a broken lab
// catalog make LabkeepCapacityExhausted and LabkeepLabCatalogRefused fire;
// the reaper running every "minute" and nothing failing to provision keep
// the other alerts quiet. The evaluation runs in
// infra/monitoring/testdata/rulecheck, the module that carries
// Prometheus.
func TestAlertsOnRealScrapes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds Prometheus's promql engine; skipped with -short")
	}
	e := newEnv(t, stacktest.Options{MaxVMs: 1})
	dir := t.TempDir()
	scrapes := 0
	scrape := func() {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d.prom", scrapes)), []byte(e.Scrape()), 0o644); err != nil {
			t.Fatal(err)
		}
		scrapes++
	}
	reapTick := func() {
		t.Helper()
		if r := e.Do("POST", "/reapTick", stacktest.SchedulerToken, "", ""); r.Status != http.StatusOK {
			t.Fatalf("reapTick = %d %s", r.Status, r.Body)
		}
	}

	reapTick()
	scrape()
	e.Opened("alice", "linux-vm")
	if r := e.Open("bob", "linux-vm"); r.Status != http.StatusServiceUnavailable || r.Code != "no_capacity" {
		t.Fatalf("open beyond LABKEEP_MAX_CONCURRENT_VMS=1 = %d %s, want 503 no_capacity", r.Status, r.Body)
	}
	shipped, err := infra.File("labs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	writeCatalog(t, e, strings.Replace(string(shipped), "kind: pod", "kind: container", 1))
	stacktest.Eventually(t, reloadWait, func() (bool, string) {
		n := metric(t, e, "labkeep_lab_catalog_reload_failures_total", nil)
		return n == 1, fmt.Sprintf("reload failures %v", n)
	})
	reapTick()
	scrape()
	reapTick()
	scrape()

	groups, err := monitoring.RuleGroups()
	if err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, groups, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "test", "-count=1", "-v", "-run", "^TestAlertsOnScrapes$", ".")
	cmd.Dir = filepath.Join("..", "..", "infra", "monitoring", "testdata", "rulecheck")
	cmd.Env = append(os.Environ(), "LABKEEP_RULES="+rules, "LABKEEP_SCRAPES="+dir,
		"LABKEEP_FIRING=LabkeepCapacityExhausted,LabkeepLabCatalogRefused", "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	t.Logf("rulecheck:\n%s", out)
	if err != nil {
		t.Fatalf("rulecheck: %v", err)
	}
}
