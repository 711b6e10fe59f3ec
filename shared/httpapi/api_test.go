package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"labkeep/shared/access"
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
		{fmt.Errorf("%w: x", access.ErrUnauthorized), http.StatusUnauthorized, "unauthorized"},
		{fmt.Errorf("%w: x", access.ErrTooLarge), http.StatusRequestEntityTooLarge, "too_large"},
		{fmt.Errorf("%w: x", access.ErrUnsupportedMedia), http.StatusUnsupportedMediaType, "unsupported_media_type"},
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
		v := a.view(s, access.Principal{})
		if v.RemainingSeconds != tc.want {
			t.Errorf("at +%s remainingSeconds = %d, want %d", tc.at, v.RemainingSeconds, tc.want)
		}
		if (v.RemainingSeconds == 0) != lifetime.Expired(w, now) {
			t.Errorf("at +%s remainingSeconds %d disagrees with Expired %v", tc.at, v.RemainingSeconds, lifetime.Expired(w, now))
		}
	}
}

// What the API server says when it refuses (quota, admission policy,
// RBAC) reaches students only as a fixed sentence per code; admins read
// the full error. The code and status never change.
func TestErrorMessagesHideClusterInternals(t *testing.T) {
	quota := errors.New(`virtualmachines.kubevirt.io "lk-1-vm" is forbidden: exceeded quota: labkeep-vms, requested: count/virtualmachines.kubevirt.io=1`)
	policy := errors.New(`ValidatingAdmissionPolicy 'refuse' denied request for system:serviceaccount:fn:labkeep-functions`)
	tests := []struct {
		name        string
		err         error
		wantStatus  int
		wantCode    string
		wantStudent string // exact message a student gets
	}{
		{"quota refusal", fmt.Errorf("%w: creating VM: %w", session.ErrNoCapacity, quota), 503, "no_capacity",
			session.Sentence(session.EndNoCapacity)},
		{"labkeep's own count", fmt.Errorf("%w: 8 of 8 VMs in use, lab x needs 1", session.ErrNoCapacity), 503, "no_capacity",
			session.Sentence(session.EndNoCapacity)},
		{"admission refusal", fmt.Errorf("%w: creating VM: %w", session.ErrProvisioning, policy), 502, "provisioning_failed",
			session.Sentence(session.EndProvisioningFailed)},
		{"ended while provisioning", fmt.Errorf("%w (it is now closed)", session.ErrEndedWhileProvisioning), 502, "provisioning_failed",
			"the session was ended (closed, or cleaned up after waiting too long for capacity) while it was being provisioned; open the lab again if you still need it"},
		{"internal", fmt.Errorf("reading row: %w", policy), 500, "internal", "internal error"},
		{"own validation text is kept", fmt.Errorf("%w: \"lab\" is required", access.ErrBadRequest), 400, "bad_request", `bad_request: "lab" is required`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := &API{now: time.Now, log: slog.New(slog.NewTextHandler(io.Discard, nil)), retryAfter: 20 * time.Second}
			for _, p := range []access.Principal{{Subject: "ann", Role: access.RoleStudent}, {Subject: "root", Role: access.RoleAdmin}} {
				w := httptest.NewRecorder()
				kind, ok := session.ErrorKind(tc.err)
				if !ok {
					kind = session.EndGhost
				}
				end := session.EndReason{Kind: kind, Actor: session.ActorOpen, Detail: tc.err.Error()}
				sess := session.Session{ID: "s1", Status: end.Status(), End: end}
				a.writeErrorFor(w, httptest.NewRequest("POST", "/openSession", nil), p, tc.err, &sess)
				var body errorBody
				if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
					t.Fatal(err)
				}
				if w.Code != tc.wantStatus || body.Error.Code != tc.wantCode {
					t.Errorf("%s: %d %q, want %d %q", p.Role, w.Code, body.Error.Code, tc.wantStatus, tc.wantCode)
				}
				want := tc.wantStudent
				if p.Admin() {
					want = tc.err.Error()
				}
				if body.Error.Message != want {
					t.Errorf("%s: message %q, want %q", p.Role, body.Error.Message, want)
				}
				if !p.Admin() {
					for _, leak := range []string{"serviceaccount", "ValidatingAdmissionPolicy", "quota", "labkeep-vms", "lk-1-vm"} {
						if strings.Contains(strings.ToLower(w.Body.String()), strings.ToLower(leak)) {
							t.Errorf("student response leaks %q: %s", leak, w.Body.String())
						}
					}
				} else if body.Session.FailureReason != end.String() || !strings.Contains(end.String(), tc.err.Error()) {
					t.Errorf("admin failureReason %q, want the stored reason %q", body.Session.FailureReason, end)
				}
			}
		})
	}
}

// A live session whose time is up reads expired, with nothing left and
// no extension offered, before the reaper has got to it.
func TestViewOfAnExpiredLiveSession(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	w := lifetime.Policy{Lifetime: time.Hour, MaxLifetime: 3 * time.Hour}.Open(t0)
	tests := []struct {
		name       string
		stored     session.Status
		at         time.Duration
		wantStatus string
		wantLeft   int64
		wantExtend bool
	}{
		{"running before expiry", session.StatusRunning, 59 * time.Minute, "running", 60, true},
		{"running at expiry", session.StatusRunning, time.Hour, "expired", 0, false},
		{"running after expiry", session.StatusRunning, time.Hour + 30*time.Second, "expired", 0, false},
		{"provisioning after expiry", session.StatusProvisioning, 2 * time.Hour, "expired", 0, false},
		{"closed stays closed", session.StatusClosed, 2 * time.Hour, "closed", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := t0.Add(tc.at)
			a := &API{now: func() time.Time { return now }}
			v := a.view(session.Session{ID: "x", Status: tc.stored, Window: w}, access.Principal{Subject: "ann", Role: access.RoleStudent})
			if v.Status != tc.wantStatus || v.RemainingSeconds != tc.wantLeft || v.Extendable != tc.wantExtend {
				t.Errorf("view = %s %d %v, want %s %d %v", v.Status, v.RemainingSeconds, v.Extendable, tc.wantStatus, tc.wantLeft, tc.wantExtend)
			}
		})
	}
}
