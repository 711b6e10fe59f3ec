package reap_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/functions/lambda"
	"labkeep/localrun/stacktest"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// runJSON is a run report as the reaper's endpoints answer it.
type runJSON struct {
	Trigger  string         `json:"trigger"`
	Counts   map[string]int `json:"counts"`
	Failures []struct {
		Kind, Session, Error string
	} `json:"failures"`
}

// The reaper's endpoints on the deployed handler: reapTick with any
// scheduler payload, adminStatus showing a row that fails every run,
// adminReapNow, /metrics, busy, and a bad-input matrix that changes nothing.
func TestReaperEndpoints(t *testing.T) {
	h := newBackend(t, stacktest.Options{MaxVMs: 8})
	stuck := h.open("s-stuck", "linux-vm")
	other := h.open("s-other", "linux-vm")
	h.Clock.Advance(61 * time.Minute)
	lift := h.RefuseVMDeletes(t, st, stuck.ID)

	payloads := []struct{ name, ctype, body string }{
		{"CloudEvent (Knative PingSource)", "application/cloudevents+json", `{"specversion":"1.0","type":"dev.knative.sources.ping","source":"/apis/v1/namespaces/labkeep/pingsources/reap","id":"1","data":{}}`},
		{"EventBridge scheduled event", "application/json", `{"version":"0","id":"x","detail-type":"Scheduled Event","source":"aws.events","detail":{}}`},
		{"empty body", "", ""},
	}
	for i, p := range payloads {
		r := h.Do("POST", "/reapTick", stacktest.SchedulerToken, p.body, p.ctype)
		if r.Status != 200 {
			t.Fatalf("reapTick with %s: %d %s", p.name, r.Status, r.Body)
		}
		var run runJSON
		if err := json.Unmarshal(r.Body, &run); err != nil {
			t.Fatal(err)
		}
		wantExpired := 0
		if i == 0 {
			wantExpired = 1 // the other session, at the first run
		}
		if run.Trigger != "schedule" || run.Counts["expired"] != wantExpired || len(run.Failures) != 1 || run.Failures[0].Session != stuck.ID {
			t.Fatalf("reapTick %d (%s): %s", i, p.name, r.Body)
		}
	}
	if got := h.status(other.ID); got != session.StatusExpired {
		t.Fatalf("the other session is %s", got)
	}

	r := h.Do("GET", "/adminStatus", h.Token("ops", "admin"), "", "")
	if r.Status != 200 {
		t.Fatalf("adminStatus: %d %s", r.Status, r.Body)
	}
	var status reap.Status
	if err := json.Unmarshal(r.Body, &status); err != nil {
		t.Fatal(err)
	}
	if len(status.FailingSessions) != 1 || status.FailingSessions[0].Session != stuck.ID || status.FailingSessions[0].RunsInARow != 3 ||
		status.FailureCounts["expired"] != 3 || status.LiveSessions != 1 || status.LiveVMs != 1 || status.Capacity != (reap.Capacity{Used: 1, Limit: 8}) || len(status.RecentRuns) != 3 {
		t.Fatalf("adminStatus does not show the row failing every run: %s", r.Body)
	}

	// Bad input: nothing runs, nothing changes.
	rowsBefore := h.Count("SELECT count(*) FROM reap_runs")
	objsBefore := h.everything()
	bad := []struct {
		name, method, path, auth, ctype, body string
		status                                int
		code                                  string
	}{
		{"reapTick without a token", "POST", "/reapTick", "", "", "", 401, "unauthorized"},
		{"reapTick with a wrong token", "POST", "/reapTick", "not-the-token", "", "", 401, "unauthorized"},
		{"reapTick with an admin JWT instead of the scheduler token", "POST", "/reapTick", h.Token("ops", "admin"), "", "", 401, "unauthorized"},
		{"reapTick with GET", "GET", "/reapTick", stacktest.SchedulerToken, "", "", 405, "method_not_allowed"},
		{"adminReapNow without auth", "POST", "/adminReapNow", "", "", "", 401, "unauthorized"},
		{"adminReapNow as a student", "POST", "/adminReapNow", h.Token("s-stuck", "student"), "", "", 403, "forbidden"},
		{"adminReapNow with an unknown field", "POST", "/adminReapNow", h.Token("ops", "admin"), "application/json", `{"force":true}`, 400, "bad_request"},
		{"adminReapNow with a text body", "POST", "/adminReapNow", h.Token("ops", "admin"), "text/plain", `go`, 415, "unsupported_media_type"},
		{"adminReapNow with an oversized body", "POST", "/adminReapNow", h.Token("ops", "admin"), "application/json", `{"x":"` + strings.Repeat("a", 70<<10) + `"}`, 413, "too_large"},
		{"adminStatus as a student", "GET", "/adminStatus", h.Token("s-other", "student"), "", "", 403, "forbidden"},
		{"adminStatus with POST", "POST", "/adminStatus", h.Token("ops", "admin"), "", "", 405, "method_not_allowed"},
		{"adminStatus with an expired JWT", "GET", "/adminStatus", h.Sign("ops", "admin", h.Clock.Now().Add(-time.Minute)), "", "", 401, "unauthorized"},
	}
	for _, tc := range bad {
		r := h.Do(tc.method, tc.path, tc.auth, tc.body, tc.ctype)
		if r.Status != tc.status || r.Code != tc.code {
			t.Errorf("%s: got %d %q, want %d %q (%s)", tc.name, r.Status, r.Code, tc.status, tc.code, r.Body)
		}
		if r.Status == 405 && r.Header.Get("Allow") == "" {
			t.Errorf("%s: 405 without Allow", tc.name)
		}
	}
	if n := h.Count("SELECT count(*) FROM reap_runs"); n != rowsBefore {
		t.Fatalf("bad requests recorded %d runs", n-rowsBefore)
	}
	if diff := cmp.Diff(objsBefore, h.everything()); diff != "" {
		t.Fatalf("bad requests changed the namespace (-before +after):\n%s", diff)
	}

	// Busy: another run holds the lock.
	unlock, ok, err := h.App.Store.TryLock(context.Background(), reap.LockName)
	if err != nil || !ok {
		t.Fatalf("take the reaper lock: ok=%v err=%v", ok, err)
	}
	r = h.Do("POST", "/adminReapNow", h.Token("ops", "admin"), "", "")
	unlock()
	if r.Status != 409 || r.Code != "busy" {
		t.Fatalf("adminReapNow while another run holds the lock: %d %s", r.Status, r.Body)
	}

	lift()
	r = h.Do("POST", "/adminReapNow", h.Token("ops", "admin"), "", "")
	var run runJSON
	if err := json.Unmarshal(r.Body, &run); err != nil || r.Status != 200 || run.Trigger != "admin" || run.Counts["expired"] != 1 || len(run.Failures) != 0 {
		t.Fatalf("adminReapNow after the fault is lifted: %d %s", r.Status, r.Body)
	}
	h.WaitGone(stuck.ID)

	m := h.Scrape()
	for _, want := range []string{
		`labkeep_reap_runs_total{result="ok",trigger="schedule"} 3`,
		`labkeep_reap_runs_total{result="ok",trigger="admin"} 1`,
		`labkeep_reap_runs_total{result="busy",trigger="admin"} 1`,
		`labkeep_reaped_items_total{kind="expired"} 2`,
		`labkeep_reap_failures_total{kind="expired"} 3`,
		`labkeep_live_sessions 1`,
		`labkeep_reap_run_duration_seconds_count 4`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// An EventBridge schedule invoking the Lambda shim runs the real reaper
// through the same handler (the shim only adapts the event).
func TestReapTickThroughLambdaShim(t *testing.T) {
	h := newBackend(t, stacktest.Options{})
	s := h.open("s-lambda", "linux-vm")
	h.Clock.Advance(61 * time.Minute)
	adapter := lambda.Adapter{Handler: h.App.Handler(), ScheduledPath: "/reapTick", SchedulerToken: stacktest.SchedulerToken}
	event := json.RawMessage(`{"version":"0","id":"53dc4d37","detail-type":"Scheduled Event","source":"aws.events","account":"123456789012","time":"2026-11-30T12:00:00Z","region":"eu-west-1","resources":["arn:aws:events:eu-west-1:123456789012:rule/labkeep-reap"],"detail":{}}`)
	res, err := adapter.Invoke(context.Background(), event)
	if err != nil {
		t.Fatal(err)
	}
	var run runJSON
	if res.StatusCode != 200 || json.Unmarshal([]byte(res.Body), &run) != nil || run.Counts["expired"] != 1 {
		t.Fatalf("EventBridge invocation: %d %s", res.StatusCode, res.Body)
	}
	if got := h.status(s.ID); got != session.StatusExpired {
		t.Fatalf("session is %s after the scheduled Lambda run", got)
	}
	h.WaitGone(s.ID)
	// A shim configured with the wrong token is refused like any caller,
	// and the refused run fails the invocation (Lambda's Errors metric).
	adapter.SchedulerToken = "wrong"
	res, err = adapter.Invoke(context.Background(), event)
	if !errors.Is(err, lambda.ErrScheduledRunFailed) || res.StatusCode != 401 {
		t.Fatalf("wrong scheduler token through the shim: %d %v, want 401 and ErrScheduledRunFailed", res.StatusCode, err)
	}
	// A run skipped because another holds the lock is no failure.
	adapter.SchedulerToken = stacktest.SchedulerToken
	unlock, ok, err := h.App.Store.TryLock(context.Background(), reap.LockName)
	if err != nil || !ok {
		t.Fatalf("take the reaper lock: ok=%v err=%v", ok, err)
	}
	res, err = adapter.Invoke(context.Background(), event)
	unlock()
	if err != nil || res.StatusCode != 200 || !strings.Contains(res.Body, `"skipped":true`) {
		t.Fatalf("skipped scheduled run through the shim: %d %v %s, want 200 skipped and no error", res.StatusCode, err, res.Body)
	}
}
