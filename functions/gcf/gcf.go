// Package gcf registers the session functions with the Google Cloud
// Functions framework as the HTTP function "Labkeep" (deploy with
// --entry-point=Labkeep; Cloud Scheduler calls /reapTick on it over HTTP).
// It holds no domain logic: it serves the same http.Handler as Knative and
// Lambda, built from the same LABKEEP_* settings.
//
// A failed initialisation (the database not reachable yet, a setting
// wrong) is not kept for the instance's life: the next request after a
// backoff (InitBackoff, doubling up to MaxInitBackoff) tries again, and
// requests in between answer the last error at once. Logs are JSON with
// Cloud Logging's keys (NewLogger: severity, message).
package gcf

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"labkeep/functions/app"
)

// FunctionName is the entry point name registered with the framework.
const FunctionName = "Labkeep"

// InitBackoff is how long after a failed initialisation the next one is
// tried; it doubles with every failure in a row, up to MaxInitBackoff.
const (
	InitBackoff    = time.Second
	MaxInitBackoff = time.Minute
)

// logger is the instance's logger, in Cloud Logging's format.
var logger = NewLogger(os.Stderr)

// instance is this function instance's application.
var instance = &initializer{build: buildFromEnv, now: time.Now, log: logger}

func init() {
	functions.HTTP(FunctionName, instance.serve)
}

// Init reads the settings and builds the application unless that is done;
// the function instance calls it on every request until it succeeds, and
// a main may call it first to fail at start. The error names the
// LABKEEP_* variable at fault.
func Init() error {
	_, err := instance.get()
	return err
}

// buildFromEnv is the application built from the LABKEEP_* settings.
func buildFromEnv() (http.Handler, error) {
	cfg, err := app.FromEnv(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	a, err := app.Build(context.Background(), cfg, time.Now, logger)
	if err != nil {
		return nil, err
	}
	return a.Handler(), nil
}

// initializer builds the handler once it can: a failure is remembered
// only until its backoff has passed.
type initializer struct {
	build func() (http.Handler, error)
	now   func() time.Time
	log   *slog.Logger

	mu       sync.Mutex // held while building: concurrent first requests wait for one build
	handler  http.Handler
	err      error
	failures int       // failed builds in a row
	retryAt  time.Time // no build before this after a failure
}

// get returns the handler, building it if none is built and no backoff
// is running; during a backoff it returns the last failure.
func (in *initializer) get() (http.Handler, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.handler != nil {
		return in.handler, nil
	}
	if in.failures > 0 && in.now().Before(in.retryAt) {
		return nil, in.err
	}
	h, err := in.build()
	if err != nil {
		in.failures++
		in.err = err
		wait := backoff(in.failures)
		in.retryAt = in.now().Add(wait)
		in.log.Error("labkeep initialisation failed; retrying on a request after the backoff", "err", err, "failures", in.failures, "backoff", wait)
		return nil, err
	}
	in.handler, in.err, in.failures = h, nil, 0
	return h, nil
}

// backoff is the wait after the n-th failure in a row (n ≥ 1).
func backoff(n int) time.Duration {
	d := InitBackoff
	for i := 1; i < n && d < MaxInitBackoff; i++ {
		d *= 2
	}
	return min(d, MaxInitBackoff)
}

func (in *initializer) serve(w http.ResponseWriter, r *http.Request) {
	h, err := in.get()
	if err != nil {
		// The instance cannot work yet; get logged why. Answer with the
		// same JSON error shape as every other failure.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintln(w, `{"error":{"code":"internal","message":"function is not initialised; see its log"}}`)
		return
	}
	h.ServeHTTP(w, r)
}

// NewLogger is a JSON logger whose records Cloud Logging reads: the level
// is "severity" with Cloud Logging's names (DEBUG, INFO, WARNING, ERROR)
// and the text is "message"; with "level" every line would be DEFAULT.
func NewLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{ReplaceAttr: cloudLoggingKeys}))
}

func cloudLoggingKeys(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.LevelKey:
		level, _ := a.Value.Any().(slog.Level)
		return slog.String("severity", severity(level))
	case slog.MessageKey:
		a.Key = "message"
	}
	return a
}

// severity is Cloud Logging's name for level; levels between slog's own
// take the name of the one below.
func severity(level slog.Level) string {
	switch {
	case level >= slog.LevelError:
		return "ERROR"
	case level >= slog.LevelWarn:
		return "WARNING"
	case level >= slog.LevelInfo:
		return "INFO"
	default:
		return "DEBUG"
	}
}
