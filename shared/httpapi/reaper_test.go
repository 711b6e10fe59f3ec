package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"

	"labkeep/shared/access"
	"labkeep/shared/reap"
)

// runner answers every RunOnce with err, or with a report of its trigger.
type runner struct {
	err   error
	calls int
}

func (r *runner) RunOnce(_ context.Context, t reap.Trigger) (reap.Report, error) {
	r.calls++
	if r.err != nil {
		return reap.Report{}, r.err
	}
	return reap.Report{Trigger: t, Counts: map[reap.ItemKind]int{reap.Expired: 1}}, nil
}

// reaperTestAuth is the JWT secret and clock of these tests' APIs and an
// admin's token under them.
func reaperTestAuth(t *testing.T) (secret []byte, now func() time.Time, admin string) {
	t.Helper()
	secret = []byte("reaper-test-secret-0123456789abcdef")
	now = func() time.Time { return time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC) }
	admin, err := access.Sign(secret, "ops", access.RoleAdmin, now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return secret, now, admin
}

// A run already going is the schedule's success (reapTick 200 skipped) but
// the admin's refusal (adminReapNow 409 busy); any other error is an error
// for both. The HTTP layer over a fake runner: the real lock is test/reap's.
func TestReapWhileARunIsGoing(t *testing.T) {
	secret, now, admin := reaperTestAuth(t)
	const token = "scheduler-token-0123456789"
	busy := fmt.Errorf("%w: another reaper run holds the lock", reap.ErrBusy)
	type answer struct {
		Status  int
		Skipped bool
		Code    string
		Trigger reap.Trigger
	}
	tests := []struct {
		name       string
		path, auth string
		err        error
		want       answer
	}{
		{"scheduled run while another is going: skipped, 200", "/reapTick", token, busy,
			answer{Status: 200, Skipped: true, Code: "busy", Trigger: reap.TriggerSchedule}},
		{"admin run while another is going: 409 busy", "/adminReapNow", admin, busy,
			answer{Status: 409, Code: "busy"}},
		{"scheduled run that cannot start: 500, not skipped", "/reapTick", token, errors.New("reaper lock: connection refused"),
			answer{Status: 500, Code: "internal"}},
		{"scheduled run that ran: its report", "/reapTick", token, nil,
			answer{Status: 200, Trigger: reap.TriggerSchedule}},
		{"admin run that ran: its report", "/adminReapNow", admin, nil,
			answer{Status: 200, Trigger: reap.TriggerAdmin}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rr := &runner{err: tc.err}
			a := New(Options{Auth: access.NewAuthenticator(secret, now), Now: now, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			h := a.WithReaper(ReaperOptions{Reaper: rr, SchedulerToken: token})
			req := httptest.NewRequest("POST", tc.path, nil)
			req.Header.Set("Authorization", "Bearer "+tc.auth)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			var body struct {
				Skipped bool         `json:"skipped"`
				Code    string       `json:"code"`
				Trigger reap.Trigger `json:"trigger"`
				Error   struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatalf("%s: %v", w.Body, err)
			}
			got := answer{Status: w.Code, Skipped: body.Skipped, Code: body.Code + body.Error.Code, Trigger: body.Trigger}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s\nbody %s", diff, w.Body)
			}
			if rr.calls != 1 {
				t.Errorf("%d runs asked for, want 1", rr.calls)
			}
		})
	}
}

// adminReapNow {"dryRun": true} runs the dry reaper and only it; without
// dryRun (or false) the real one; a server with no dry reaper refuses a
// dry run with 400 and runs nothing. Over fake runners: that a dry run
// deletes nothing on the real stack is test/reap's.
func TestAdminReapNowDryRun(t *testing.T) {
	secret, now, admin := reaperTestAuth(t)
	tests := []struct {
		name              string
		body              string
		noDryReaper       bool
		wantStatus        int
		wantFull, wantDry int
	}{
		{"no body: the real run", "", false, 200, 1, 0},
		{`{"dryRun": false}: the real run`, `{"dryRun": false}`, false, 200, 1, 0},
		{`{"dryRun": true}: the dry run only`, `{"dryRun": true}`, false, 200, 0, 1},
		{"dryRun not a boolean: 400, nothing runs", `{"dryRun": "yes"}`, false, 400, 0, 0},
		{"dry run without a dry reaper: 400, nothing runs", `{"dryRun": true}`, true, 400, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			full, dry := &runner{}, &runner{}
			o := ReaperOptions{Reaper: full, DryRun: dry}
			if tc.noDryReaper {
				o.DryRun = nil
			}
			a := New(Options{Auth: access.NewAuthenticator(secret, now), Now: now, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			req := httptest.NewRequest("POST", "/adminReapNow", strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+admin)
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			w := httptest.NewRecorder()
			a.WithReaper(o).ServeHTTP(w, req)
			got := []int{w.Code, full.calls, dry.calls}
			if diff := cmp.Diff([]int{tc.wantStatus, tc.wantFull, tc.wantDry}, got); diff != "" {
				t.Errorf("[status, full runs, dry runs] (-want +got):\n%s\nbody %s", diff, w.Body)
			}
		})
	}
}

// countingGatherer counts the scrapes that reached it.
type countingGatherer struct{ calls int }

func (g *countingGatherer) Gather() ([]*dto.MetricFamily, error) {
	g.calls++
	return nil, nil
}

// GET /metrics answers only its bearer token: no token, another one (the
// scheduler's, an admin's JWT) or a server with none configured get 401,
// and none of them reaches the gatherer (a scrape reads the database).
func TestMetricsNeedTheirToken(t *testing.T) {
	secret, now, admin := reaperTestAuth(t)
	const metricsToken, schedulerToken = "metrics-token-0123456789", "scheduler-token-0123456789"
	type answer struct {
		Status   int
		Gathered int
	}
	tests := []struct {
		name       string
		configured string
		auth       string
		want       answer
	}{
		{"its token: scraped", metricsToken, "Bearer " + metricsToken, answer{200, 1}},
		{"no Authorization: 401", metricsToken, "", answer{401, 0}},
		{"the scheduler's token: 401", metricsToken, "Bearer " + schedulerToken, answer{401, 0}},
		{"an admin's JWT: 401", metricsToken, "Bearer " + admin, answer{401, 0}},
		{"the token as Basic credentials: 401", metricsToken, "Basic " + metricsToken, answer{401, 0}},
		{"no token configured, empty bearer: 401", "", "Bearer ", answer{401, 0}},
		{"no token configured, any bearer: 401", "", "Bearer " + metricsToken, answer{401, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := &countingGatherer{}
			a := New(Options{Auth: access.NewAuthenticator(secret, now), Now: now, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			h := a.WithReaper(ReaperOptions{Reaper: &runner{}, SchedulerToken: schedulerToken, Gatherer: g, MetricsToken: tc.configured})
			req := httptest.NewRequest("GET", "/metrics", nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if diff := cmp.Diff(tc.want, answer{w.Code, g.calls}); diff != "" {
				t.Errorf("answer (-want +got):\n%s\nbody %s", diff, w.Body)
			}
		})
	}
}
