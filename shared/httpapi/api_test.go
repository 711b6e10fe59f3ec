package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"labkeep/shared/lifetime"
	"labkeep/shared/session"
)

func TestStatusTable(t *testing.T) {
	tests := []struct {
		err        error
		wantStatus int
		wantCode   string
	}{
		{fmt.Errorf("%w: x", session.ErrSessionExists), http.StatusConflict, "session_exists"},
		{fmt.Errorf("%w: x", session.ErrNoCapacity), http.StatusServiceUnavailable, "no_capacity"},
		{fmt.Errorf("%w: x", session.ErrExtensionCap), http.StatusConflict, "extension_cap"},
		{fmt.Errorf("%w: x", session.ErrNotRunning), http.StatusConflict, "not_running"},
		{fmt.Errorf("%w: x", session.ErrNoSession), http.StatusNotFound, "no_session"},
		{fmt.Errorf("%w: x", session.ErrUnknownLab), http.StatusBadRequest, "unknown_lab"},
		{fmt.Errorf("%w: x", session.ErrProvisioning), http.StatusBadGateway, "provisioning_failed"},
		{fmt.Errorf("%w: x", ErrUnauthorized), http.StatusUnauthorized, "unauthorized"},
		{fmt.Errorf("%w: x", ErrTooLarge), http.StatusRequestEntityTooLarge, "too_large"},
		{fmt.Errorf("%w: x", ErrUnsupportedMedia), http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{errors.New("database on fire"), http.StatusInternalServerError, "internal"},
	}
	for _, tc := range tests {
		t.Run(tc.wantCode, func(t *testing.T) {
			status, code := StatusOf(tc.err)
			if status != tc.wantStatus || code != tc.wantCode {
				t.Errorf("StatusOf(%v) = %d %q, want %d %q", tc.err, status, code, tc.wantStatus, tc.wantCode)
			}
		})
	}
}

// remainingSeconds is zero exactly when lifetime.Expired says so.
func TestRemainingSecondsAgreesWithExpiry(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	w := lifetime.Policy{Lifetime: time.Hour, MaxLifetime: 3 * time.Hour}.Open(t0)
	s := session.Session{ID: "x", Status: session.StatusRunning, Window: w}
	tests := []struct {
		at   time.Duration
		want int64
	}{
		{0, 3600},
		{time.Millisecond, 3600},
		{time.Hour - 1500*time.Millisecond, 2},
		{time.Hour - time.Nanosecond, 1},
		{time.Hour, 0},
		{2 * time.Hour, 0},
	}
	for _, tc := range tests {
		now := t0.Add(tc.at)
		a := &API{now: func() time.Time { return now }}
		v := a.view(s)
		if v.RemainingSeconds != tc.want {
			t.Errorf("at +%s remainingSeconds = %d, want %d", tc.at, v.RemainingSeconds, tc.want)
		}
		if (v.RemainingSeconds == 0) != lifetime.Expired(w, now) {
			t.Errorf("at +%s remainingSeconds %d disagrees with Expired %v", tc.at, v.RemainingSeconds, lifetime.Expired(w, now))
		}
	}
}
