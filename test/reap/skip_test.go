package reap_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/stacktest"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// While another run holds the real reaper lock (another replica, a second
// scheduler), reapTick answers 200 skipped — the schedule did its job — and
// adminReapNow 409 busy; neither records a run nor touches a session. Once
// the lock is free, reapTick runs again.
func TestReapTickSkipsWhileARunIsGoing(t *testing.T) {
	h := newBackend(t, stacktest.Options{})
	s := h.open("s-skip", "linux-vm")
	h.Clock.Advance(61 * time.Minute)

	unlock, ok, err := h.App.Store.TryLock(context.Background(), reap.LockName)
	if err != nil || !ok {
		t.Fatalf("take the reaper lock: ok=%v err=%v", ok, err)
	}
	defer unlock()
	runsBefore := h.Count("SELECT count(*) FROM reap_runs")

	r := h.Do("POST", "/reapTick", stacktest.SchedulerToken, "", "")
	var skipped struct {
		Trigger string `json:"trigger"`
		Skipped bool   `json:"skipped"`
		Code    string `json:"code"`
	}
	if err := json.Unmarshal(r.Body, &skipped); err != nil || r.Status != 200 || !skipped.Skipped || skipped.Code != "busy" || skipped.Trigger != "schedule" {
		t.Fatalf("reapTick while another run holds the lock: %d %s", r.Status, r.Body)
	}
	r = h.Do("POST", "/adminReapNow", h.Token("ops", "admin"), "", "")
	if r.Status != 409 || r.Code != "busy" {
		t.Fatalf("adminReapNow while another run holds the lock: %d %s", r.Status, r.Body)
	}
	if n := h.Count("SELECT count(*) FROM reap_runs"); n != runsBefore {
		t.Fatalf("%d runs recorded while the lock was held", n-runsBefore)
	}
	if got := h.status(s.ID); got != session.StatusRunning {
		t.Fatalf("expired session is %s while no run could happen", got)
	}
	m := h.Scrape()
	for _, want := range []string{`labkeep_reap_runs_total{result="busy",trigger="schedule"} 1`, `labkeep_reap_runs_total{result="busy",trigger="admin"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	unlock()
	r = h.Do("POST", "/reapTick", stacktest.SchedulerToken, "", "")
	var run runJSON
	if err := json.Unmarshal(r.Body, &run); err != nil || r.Status != 200 || run.Counts["expired"] != 1 {
		t.Fatalf("reapTick once the lock is free: %d %s", r.Status, r.Body)
	}
	if strings.Contains(string(r.Body), `"skipped"`) {
		t.Fatalf("a run that happened reads as skipped: %s", r.Body)
	}
	h.WaitGone(s.ID)
}
