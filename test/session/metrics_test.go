package session_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"labkeep/functions/app"
	"labkeep/localrun/stacktest"
)

// metric is the value of the series name with labels (a subset of its
// labels; nil: the unlabelled series) in the deployment's registry, the
// one /metrics serves; 0 if there is no such series yet. Counters,
// gauges, and a histogram's sample count.
func metric(t *testing.T, e *stacktest.Deployment, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := e.App.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// A student's open, extend and close on the real stack move the session
// series and the request latency series, read from the registry the
// deployment's /metrics serves, and from /metrics itself.
func TestSessionMetricsMove(t *testing.T) {
	e := newEnv(t, stacktest.Options{})
	e.Opened("alice", "linux-vm")
	e.WaitRunning("alice", time.Minute)
	if got := metric(t, e, "labkeep_sessions", map[string]string{"lab": "linux-vm", "status": "running"}); got != 1 {
		t.Errorf("labkeep_sessions{linux-vm,running} = %v, want 1", got)
	}
	if r := e.Do("POST", "/extendSession", e.Token("alice", "student"), "", ""); r.Status != http.StatusOK {
		t.Fatalf("extend = %d %s", r.Status, r.Body)
	}
	if r := e.Open("bob", "no-such-lab"); r.Status != http.StatusBadRequest {
		t.Fatalf("open of an unknown lab = %d %s", r.Status, r.Body)
	}
	if r := e.Close("alice"); r.Status != http.StatusOK {
		t.Fatalf("close = %d %s", r.Status, r.Body)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"labkeep_session_opens_total", map[string]string{"lab": "linux-vm", "result": "ok"}, 1},
		{"labkeep_session_opens_total", map[string]string{"lab": "", "result": "unknown_lab"}, 1},
		{"labkeep_session_time_to_ready_seconds", map[string]string{"lab": "linux-vm"}, 1},
		{"labkeep_session_extensions_total", map[string]string{"result": "ok"}, 1},
		{"labkeep_session_ends_total", map[string]string{"reason": "closed", "actor": "student"}, 1},
		{"labkeep_sessions", map[string]string{"lab": "linux-vm"}, 0},
		{"labkeep_http_request_duration_seconds", map[string]string{"route": "/openSession", "code": "201"}, 1},
		{"labkeep_http_request_duration_seconds", map[string]string{"route": "/closeSession", "code": "200"}, 1},
	} {
		if got := metric(t, e, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// Without LABKEEP_METRICS_ADDR the public handler serves /metrics, to
	// the metrics token only: nothing reaches the database for anyone else.
	for _, tc := range []struct{ who, token string }{
		{"nobody", ""}, {"the scheduler", stacktest.SchedulerToken}, {"an admin", e.Token("ops", "admin")},
	} {
		if r := e.Do("GET", "/metrics", tc.token, "", ""); r.Status != http.StatusUnauthorized || strings.Contains(string(r.Body), "labkeep_") {
			t.Errorf("GET /metrics as %s = %d %.200s, want 401 unauthorized", tc.who, r.Status, r.Body)
		}
	}
	body := e.Scrape()
	if !strings.Contains(body, `labkeep_session_opens_total{lab="linux-vm",result="ok"} 1`) {
		t.Errorf("/metrics lacks the open counter:\n%.2000s", body)
	}
}

// With LABKEEP_METRICS_ADDR set, the public handler has no /metrics (it
// is labkeep-http's separate listener's).
func TestMetricsAddrTakesMetricsOffThePublicHandler(t *testing.T) {
	e := newEnv(t, stacktest.Options{})
	cfg := e.App.Config
	cfg.MetricsAddr = "127.0.0.1:0"
	a, err := app.Build(context.Background(), cfg, time.Now, stacktest.Logger())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	c := stacktest.NewClient(t, srv.URL)
	if r := c.Do("GET", "/metrics", "", "", ""); r.Status != http.StatusNotFound || strings.Contains(string(r.Body), "labkeep_") {
		t.Errorf("public GET /metrics with LABKEEP_METRICS_ADDR set = %d %.200s, want 404", r.Status, r.Body)
	}
	if r := c.Do("GET", "/healthz", "", "", ""); r.Status != http.StatusOK {
		t.Errorf("public /healthz = %d, want 200 (the handler serves)", r.Status)
	}
}
