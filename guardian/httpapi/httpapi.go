// Package httpapi serves guardian's HTTP API: GET /alerts (recent alerts),
// POST /cleanup (kill every unprotected process; bearer token), GET
// /healthz (200 only while a live workspace cgroup is guarded: readiness),
// GET /livez (200 while guardian's watch runs, workspace or not: start-up
// and liveness) and GET /metrics (Prometheus). It is an adapter over the loops
// of package guard: it uses guard's types and errors, and guard knows
// nothing of HTTP.
//
// openapi.yaml beside this file describes the API once: requests, status
// codes and bodies, errors included. Its tests check every answer against
// it, and labkeep's cleanup client (which shares no Go package with
// guardian) checks its requests and parsing against the same file.
package httpapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"labkeep/guardian/alert"
	"labkeep/guardian/guard"
)

// Errors of the API itself; the guardian's own come from package guard.
var (
	ErrUnauthorized    = errors.New("missing or wrong bearer token")
	ErrCleanupDisabled = errors.New("cleanup is disabled: no token configured")
)

// statusOf is the one table from errors to HTTP status.
var statusOf = []struct {
	err    error
	status int
}{
	{ErrUnauthorized, http.StatusUnauthorized},
	{ErrCleanupDisabled, http.StatusForbidden},
	{guard.ErrBusy, http.StatusConflict},
	{guard.ErrUnhealthy, http.StatusServiceUnavailable},
	{guard.ErrNoWorkspace, http.StatusServiceUnavailable},
}

func status(err error) int {
	for _, s := range statusOf {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return http.StatusInternalServerError
}

// cleanupResponse is the body of a successful POST /cleanup.
type cleanupResponse struct {
	Killed []int  `json:"killed"` // PIDs killed
	Failed int    `json:"failed"` // processes that could not be killed
	Note   string `json:"note,omitempty"`
}

// Backend is what the API needs of the guardian (*guard.Guardian
// implements it).
type Backend interface {
	// Alerts returns the recent alerts, oldest first.
	Alerts() []alert.Alert
	// Cleanup kills every unprotected process. Returns guard.ErrBusy when
	// an emergency action is already running.
	Cleanup(ctx context.Context) (guard.CleanupResult, error)
	// Healthy returns nil when guardian guards a live workspace cgroup
	// and its loops are running, else an error wrapping
	// guard.ErrUnhealthy.
	Healthy() error
	// Live returns nil while guardian watches for the workspace, whether
	// or not it exists, else an error wrapping guard.ErrUnhealthy.
	Live() error
}

var _ Backend = (*guard.Guardian)(nil)

// New returns the API handler. token guards POST /cleanup; an empty token
// disables it. gatherer serves /metrics.
func New(b Backend, token string, gatherer prometheus.Gatherer, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /alerts", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"alerts": b.Alerts()})
	})
	mux.HandleFunc("POST /cleanup", func(w http.ResponseWriter, r *http.Request) {
		if err := authorize(r, token); err != nil {
			writeError(w, err)
			return
		}
		res, err := b.Cleanup(r.Context())
		if err != nil {
			writeError(w, err)
			return
		}
		if log != nil {
			log.Info("cleanup via API", "killed", len(res.Killed), "failed", res.Failed, "remote", r.RemoteAddr)
		}
		killed := res.Killed
		if killed == nil {
			killed = []int{}
		}
		writeJSON(w, http.StatusOK, cleanupResponse{Killed: killed, Failed: res.Failed, Note: res.Note})
	})
	probe := func(check func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if err := check(); err != nil {
				writeError(w, err)
				return
			}
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		}
	}
	mux.HandleFunc("GET /healthz", probe(b.Healthy))
	mux.HandleFunc("GET /livez", probe(b.Live))
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	return mux
}

func authorize(r *http.Request, token string) error {
	if token == "" {
		return ErrCleanupDisabled
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
		return ErrUnauthorized
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, status(err), map[string]string{"error": err.Error()})
}
