// Package httpapi serves guardian's HTTP API: GET /alerts (recent alerts),
// POST /cleanup (kill every unprotected process; bearer token), GET
// /healthz and GET /metrics (Prometheus).
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
)

// Errors the API maps to HTTP statuses.
var (
	ErrUnauthorized    = errors.New("missing or wrong bearer token")
	ErrCleanupDisabled = errors.New("cleanup is disabled: no token configured")
	ErrBusy            = errors.New("another emergency action is running")
	ErrUnhealthy       = errors.New("guardian is not healthy")
)

// statusOf is the one table from domain errors to HTTP status.
var statusOf = []struct {
	err    error
	status int
}{
	{ErrUnauthorized, http.StatusUnauthorized},
	{ErrCleanupDisabled, http.StatusForbidden},
	{ErrBusy, http.StatusConflict},
	{ErrUnhealthy, http.StatusServiceUnavailable},
}

func status(err error) int {
	for _, s := range statusOf {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return http.StatusInternalServerError
}

// CleanupResult reports a cleanup.
type CleanupResult struct {
	Killed []int  `json:"killed"` // PIDs killed
	Failed int    `json:"failed"` // processes that could not be killed
	Note   string `json:"note,omitempty"`
}

// Backend is what the API exposes.
type Backend interface {
	// Alerts returns the recent alerts, oldest first.
	Alerts() []alert.Alert
	// Cleanup kills every unprotected process. Returns ErrBusy when an
	// emergency action is already running.
	Cleanup(ctx context.Context) (CleanupResult, error)
	// Healthy returns nil when guardian's loops are running, else an error
	// wrapping ErrUnhealthy.
	Healthy() error
}

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
		writeJSON(w, http.StatusOK, res)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := b.Healthy(); err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
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
