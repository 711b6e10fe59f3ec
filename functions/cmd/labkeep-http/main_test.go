package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// An invalid setting stops the server at start with the variable's name.
func TestRunFailsNamingTheVariable(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Setenv("LABKEEP_ENV", "")
	os.Unsetenv("LABKEEP_ENV")
	if err := run(log); err == nil || !strings.Contains(err.Error(), "LABKEEP_ENV") {
		t.Errorf("run without LABKEEP_ENV = %v", err)
	}
	t.Setenv("LABKEEP_ENV", "dev")
	t.Setenv("LABKEEP_DATABASE_URL", "postgres://nowhere/x")
	t.Setenv("LABKEEP_JWT_SECRET", strings.Repeat("x", 32))
	t.Setenv("LABKEEP_WORKSPACE_KEY", strings.Repeat("w", 32))
	t.Setenv("LABKEEP_SCHEDULER_TOKEN", "")
	os.Unsetenv("LABKEEP_SCHEDULER_TOKEN")
	if err := run(log); err == nil || !strings.Contains(err.Error(), "LABKEEP_SCHEDULER_TOKEN") {
		t.Errorf("run without LABKEEP_SCHEDULER_TOKEN = %v", err)
	}
	t.Setenv("LABKEEP_SCHEDULER_TOKEN", strings.Repeat("t", 32))
	t.Setenv("LABKEEP_SESSION_MAX_LIFETIME", "10m")
	if err := run(log); err == nil || !strings.Contains(err.Error(), "LABKEEP_SESSION_MAX_LIFETIME") {
		t.Errorf("run with max lifetime below lifetime = %v", err)
	}
}

// The metrics server answers GET /metrics from its gatherer and nothing
// else.
func TestMetricsServer(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "labkeep_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Inc()
	srv := httptest.NewServer(metricsServer("", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})).Handler)
	defer srv.Close()
	for _, tc := range []struct {
		method, path string
		wantCode     int
		wantBody     string
	}{
		{"GET", "/metrics", 200, "labkeep_test_total 1"},
		{"GET", "/openSession", 404, ""},
		{"POST", "/metrics", 405, ""},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.wantCode || !strings.Contains(string(body), tc.wantBody) {
			t.Errorf("%s %s = %d %q, want %d with %q", tc.method, tc.path, resp.StatusCode, body, tc.wantCode, tc.wantBody)
		}
	}
}
