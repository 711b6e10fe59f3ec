package gcf

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A misconfigured instance fails its initialisation naming the variable
// and answers every request with a JSON 500, never with half a setup.
func TestMisconfiguredFunction(t *testing.T) {
	t.Setenv("LABKEEP_ENV", "")
	os.Unsetenv("LABKEEP_ENV")
	if err := Init(); err == nil || !strings.Contains(err.Error(), "LABKEEP_ENV") {
		t.Fatalf("Init = %v, want an error naming LABKEEP_ENV", err)
	}
	rec := httptest.NewRecorder()
	instance.serve(rec, httptest.NewRequest(http.MethodGet, "/getSession", nil))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"code":"internal"`) {
		t.Errorf("serve = %d %s", rec.Code, rec.Body)
	}
}

// A failed initialisation is retried on a request after its backoff
// (doubling per failure), answered at once in between, and a successful
// one is kept: the instance recovers once what it needs is there.
func TestInitialisationIsRetriedAfterABackoff(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	outcomes := []error{errors.New("database not reachable"), errors.New("database still not reachable"), nil}
	builds := 0
	in := &initializer{
		now: func() time.Time { return now },
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		build: func() (http.Handler, error) {
			err := outcomes[builds]
			builds++
			if err != nil {
				return nil, err
			}
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }), nil
		},
	}
	steps := []struct {
		name       string
		advance    time.Duration
		wantStatus int
		wantBuilds int
	}{
		{"first request: the build fails", 0, 500, 1},
		{"within the first backoff (1s): the failure, no build", 999 * time.Millisecond, 500, 1},
		{"after the first backoff: built again, fails again", time.Millisecond, 500, 2},
		{"within the doubled backoff (2s): no build", 1999 * time.Millisecond, 500, 2},
		{"after the doubled backoff: built, served", time.Millisecond, http.StatusTeapot, 3},
		{"later requests: the built handler, no build", time.Hour, http.StatusTeapot, 3},
	}
	for _, s := range steps {
		now = now.Add(s.advance)
		rec := httptest.NewRecorder()
		in.serve(rec, httptest.NewRequest(http.MethodGet, "/getSession", nil))
		if rec.Code != s.wantStatus || builds != s.wantBuilds {
			t.Errorf("%s: status %d after %d builds, want %d after %d", s.name, rec.Code, builds, s.wantStatus, s.wantBuilds)
		}
	}
}

func TestBackoffDoublesUpToTheMaximum(t *testing.T) {
	got := []time.Duration{}
	for n := 1; n <= 9; n++ {
		got = append(got, backoff(n))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute, time.Minute}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("backoff (-want +got):\n%s", diff)
	}
}

// Cloud Logging reads a JSON line's "severity" (with its own level names)
// and "message"; slog's "level" and "msg" would leave every line DEFAULT.
func TestLogsUseCloudLoggingKeys(t *testing.T) {
	tests := []struct {
		name         string
		level        slog.Level
		wantSeverity string
	}{
		{"info", slog.LevelInfo, "INFO"},
		{"warn is WARNING", slog.LevelWarn, "WARNING"},
		{"error", slog.LevelError, "ERROR"},
		{"above error", slog.LevelError + 4, "ERROR"},
		{"between info and warn", slog.LevelInfo + 2, "INFO"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			NewLogger(&buf).Log(t.Context(), tc.level, "reap run", "session", "s1")
			var line map[string]any
			if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
				t.Fatalf("%s: %v", buf.String(), err)
			}
			delete(line, "time")
			want := map[string]any{"severity": tc.wantSeverity, "message": "reap run", "session": "s1"}
			if diff := cmp.Diff(want, line); diff != "" {
				t.Errorf("log line (-want +got):\n%s", diff)
			}
		})
	}
}
