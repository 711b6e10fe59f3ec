package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"labkeep/guardian/alert"
	"labkeep/guardian/guard"
)

type backend struct {
	cleanups int
	busy     bool
	health   error
	killed   []int // what a cleanup kills
	live     error
	noWS     bool // no workspace cgroup guarded
}

func (b *backend) Alerts() []alert.Alert {
	return []alert.Alert{{Kind: "sshd-gone", Severity: alert.Critical, Count: 1, First: time.Unix(1, 0), Last: time.Unix(1, 0)}}
}

func (b *backend) Cleanup(context.Context) (guard.CleanupResult, error) {
	if b.busy {
		return guard.CleanupResult{}, guard.ErrBusy
	}
	if b.noWS {
		return guard.CleanupResult{}, guard.ErrNoWorkspace
	}
	b.cleanups++
	return guard.CleanupResult{Killed: b.killed}, nil
}

func (b *backend) Healthy() error { return b.health }
func (b *backend) Live() error    { return b.live }

func TestAPI(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "guardian_test_total", Help: "t"})
	reg.MustRegister(c)
	c.Inc()
	tests := []struct {
		name, method, path, token, apiToken string
		b                                   *backend
		wantStatus                          int
		wantBody                            string
		wantCleanups                        int
	}{
		{"alerts", "GET", "/alerts", "", "s3cret", &backend{}, 200, `"kind":"sshd-gone"`, 0},
		{"cleanup with the token", "POST", "/cleanup", "s3cret", "s3cret", &backend{killed: []int{42}}, 200, `"killed":[42]`, 1},
		{"cleanup that killed nothing lists no PIDs", "POST", "/cleanup", "s3cret", "s3cret", &backend{}, 200, `"killed":[]`, 1},
		{"cleanup without a token", "POST", "/cleanup", "", "s3cret", &backend{}, 401, "bearer", 0},
		{"cleanup with a wrong token", "POST", "/cleanup", "s3cre", "s3cret", &backend{}, 401, "bearer", 0},
		{"cleanup disabled when no token is configured", "POST", "/cleanup", "", "", &backend{}, 403, "disabled", 0},
		{"cleanup while busy", "POST", "/cleanup", "s3cret", "s3cret", &backend{busy: true}, 409, "another", 0},
		{"GET cleanup is not allowed", "GET", "/cleanup", "s3cret", "s3cret", &backend{}, 405, "", 0},
		{"healthy", "GET", "/healthz", "", "", &backend{}, 200, "ok", 0},
		{"unhealthy", "GET", "/healthz", "", "", &backend{health: fmt.Errorf("memory loop stalled: %w", guard.ErrUnhealthy)}, 503, "stalled", 0},
		{"cleanup with no workspace guarded", "POST", "/cleanup", "s3cret", "s3cret", &backend{noWS: true}, 503, "no workspace", 0},
		{"not ready while no workspace is guarded", "GET", "/healthz", "", "", &backend{health: fmt.Errorf("no live workspace cgroup guarded: %w", guard.ErrUnhealthy)}, 503, "no live workspace", 0},
		{"live while waiting for the workspace", "GET", "/livez", "", "", &backend{health: fmt.Errorf("no live workspace cgroup guarded: %w", guard.ErrUnhealthy)}, 200, "ok", 0},
		{"not live when the watch stalled", "GET", "/livez", "", "", &backend{live: fmt.Errorf("watch loop stalled: %w", guard.ErrUnhealthy)}, 503, "stalled", 0},
		{"metrics", "GET", "/metrics", "", "", &backend{}, 200, "guardian_test_total 1", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(New(tt.b, tt.apiToken, reg, nil))
			defer srv.Close()
			req, _ := http.NewRequest(tt.method, srv.URL+tt.path, nil)
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.wantStatus || !strings.Contains(string(body), tt.wantBody) {
				t.Errorf("%s %s = %d %s; want %d containing %q", tt.method, tt.path, resp.StatusCode, body, tt.wantStatus, tt.wantBody)
			}
			if tt.b.cleanups != tt.wantCleanups {
				t.Errorf("cleanups = %d; want %d", tt.b.cleanups, tt.wantCleanups)
			}
			if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && !json.Valid(body) {
				t.Errorf("invalid JSON: %s", body)
			}
		})
	}
}
