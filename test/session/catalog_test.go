package session_test

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"labkeep/infra"
	"labkeep/localrun/stacktest"
	"labkeep/shared/labs"
)

// reloadWait bounds how long a catalog change takes to be in force: the
// reload interval plus room for a loaded machine. Only an upper bound of
// the polling, never asserted as a speed.
const reloadWait = labs.DefaultReload + 50*time.Second

// writeCatalog replaces the deployment's labs file atomically (write, then
// rename), as a kubelet's symlink swap replaces a ConfigMap's content.
func writeCatalog(t *testing.T, e *stacktest.Deployment, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(e.App.Config.LabsFile), ".labs.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, e.App.Config.LabsFile); err != nil {
		t.Fatal(err)
	}
}

// labNames is GET /labs's names for a student.
func labNames(t *testing.T, e *stacktest.Deployment) []string {
	t.Helper()
	r := e.Do("GET", "/labs", e.Token("lister", "student"), "", "")
	if r.Status != http.StatusOK {
		t.Fatalf("GET /labs = %d %s", r.Status, r.Body)
	}
	var names []string
	for _, part := range strings.Split(string(r.Body), `"name":"`)[1:] {
		names = append(names, part[:strings.IndexByte(part, '"')])
	}
	slices.Sort(names)
	return names
}

// The catalog file changes under running functions: a lab added is
// opened within the reload interval without a restart; a lab removed
// leaves the session opened from it extendable and closable; a broken
// file changes nothing and is reported in the metrics.
func TestCatalogReloadsWithoutRestart(t *testing.T) {
	e := newEnv(t, stacktest.Options{})
	shipped, err := infra.File("labs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	alice := e.Opened("alice", "linux-vm")
	e.WaitRunning("alice", time.Minute)

	if r := e.Open("bob", "extra-vm"); r.Status != http.StatusBadRequest {
		t.Fatalf("open of a lab not yet in the catalog = %d %s, want 400", r.Status, r.Body)
	}
	// extra-vm is linux-vm renamed: linux-vm leaves the catalog.
	changed := strings.Replace(string(shipped), "- name: linux-vm", "- name: extra-vm", 1)
	writeCatalog(t, e, changed)
	stacktest.Eventually(t, reloadWait, func() (bool, string) {
		names := labNames(t, e)
		return slices.Contains(names, "extra-vm"), strings.Join(names, ",")
	})
	if got := metric(t, e, "labkeep_lab_catalog_generation", nil); got != 2 {
		t.Errorf("labkeep_lab_catalog_generation = %v after one change, want 2", got)
	}
	e.Opened("bob", "extra-vm")
	if r := e.Open("carol", "linux-vm"); r.Status != http.StatusBadRequest {
		t.Errorf("open of a lab removed from the catalog = %d %s, want 400", r.Status, r.Body)
	}

	// The session opened from the removed lab keeps what it was opened with.
	if r := e.Do("POST", "/extendSession", e.Token("alice", "student"), "", ""); r.Status != http.StatusOK {
		t.Errorf("extend of a session whose lab left the catalog = %d %s, want 200", r.Status, r.Body)
	}

	before := labNames(t, e)
	writeCatalog(t, e, strings.Replace(changed, "kind: pod", "kind: container", 1))
	stacktest.Eventually(t, reloadWait, func() (bool, string) {
		n := metric(t, e, "labkeep_lab_catalog_reload_failures_total", nil)
		return n == 1, "reload failures " + strings.TrimSpace(strings.Repeat("I", int(n)))
	})
	if got := labNames(t, e); !slices.Equal(before, got) {
		t.Errorf("labs after a broken catalog = %v, want unchanged %v", got, before)
	}
	if got := metric(t, e, "labkeep_lab_catalog_generation", nil); got != 2 {
		t.Errorf("labkeep_lab_catalog_generation = %v after a refused file, want still 2", got)
	}
	e.Opened("carol", "extra-vm")

	sel := "labkeep.io/session=" + alice.ID
	if r := e.Close("alice"); r.Status != http.StatusOK {
		t.Fatalf("close of a session whose lab left the catalog = %d %s", r.Status, r.Body)
	}
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		left := e.Objects(sel)
		return len(left) == 0, strings.Join(left, ",")
	})
}
