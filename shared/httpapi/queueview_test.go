package httpapi

import (
	"encoding/json"
	"labkeep/shared/line"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/access"
	"labkeep/shared/session"
)

// answer is the JSON body the API writes for st (an open's or a poll's
// answer) to caller p, at 09:00 UTC.
func answer(t *testing.T, st session.Standing, p access.Principal) []byte {
	t.Helper()
	a := &API{now: func() time.Time { return time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC) }}
	rec := httptest.NewRecorder()
	a.replyStanding(rec, httptest.NewRequest(http.MethodGet, "/getSession", nil), p, http.StatusOK, st, nil)
	if rec.Code != http.StatusOK {
		t.Fatalf("answered %d %s, want 200", rec.Code, rec.Body)
	}
	return rec.Body.Bytes()
}

var student = access.Principal{Subject: "ann", Role: access.RoleStudent}

// A place in the line carries its place and ETA in whole seconds, rounded
// up (an ETA under a second is never shown as 0 while the wait is not
// over); a session carries none of the three fields.
func TestViewQueuePlace(t *testing.T) {
	type place struct {
		Position       *int
		ETA, ETALatest *int64
	}
	pos := func(n int) *int { return &n }
	sec := func(n int64) *int64 { return &n }
	tests := []struct {
		name string
		st   session.Standing
		want place
	}{
		{"queued, next in line", session.Standing{Waiting: &line.Waiting{
			Place: line.Place{Position: 1, ETA: 1500 * time.Millisecond, ETALatest: 2 * time.Hour}}},
			place{pos(1), sec(2), sec(7200)}},
		{"queued with room: ETA 0", session.Standing{Waiting: &line.Waiting{Place: line.Place{Position: 1}}},
			place{pos(1), sec(0), sec(0)}},
		{"running: no place", session.Standing{Session: &session.Session{Status: session.StatusRunning}}, place{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var v sessionJSON
			if err := json.Unmarshal(answer(t, tc.st, student), &v); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, place{v.QueuePosition, v.ETASeconds, v.ETALatestSeconds}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A place in the line reads, to a student and to an admin alike, as the
// queued session clients have always been sent: status queued, startedAt
// when the student joined, no lifetime, nodes or failure, and the
// generated private key when the open that joined handed one out.
func TestWaitingReadsAsAQueuedSession(t *testing.T) {
	joined := time.Date(2026, 1, 1, 8, 59, 0, 0, time.UTC)
	w := line.Waiting{ID: "e-1", Student: "ann", Lab: "linux-vm", Kind: "vm", StudentKey: "ssh-ed25519 AAAA ann",
		JoinedAt: joined, Place: line.Place{Position: 2, ETA: 90*time.Second + time.Millisecond, ETALatest: time.Hour}}
	const head = `{"id":"e-1","student":"ann","lab":"linux-vm","kind":"vm","status":"queued","startedAt":"2026-01-01T08:59:00Z",` +
		`"expiresAt":"0001-01-01T00:00:00Z","maxExpiresAt":"0001-01-01T00:00:00Z","remainingSeconds":0,"extendable":false,` +
		`"serverTime":"2026-01-01T09:00:00Z","nodes":[],"failureReason":"","studentKey":"ssh-ed25519 AAAA ann",`
	const place = `"queuePosition":2,"etaSeconds":91,"etaLatestSeconds":3600}`
	issued := w
	issued.StudentPrivateKey = "PRIV"
	tests := []struct {
		name    string
		waiting line.Waiting
		caller  access.Principal
		want    string
	}{
		{"to the student", w, student, head + place},
		{"to an admin", w, access.Principal{Subject: "root", Role: access.RoleAdmin}, head + place},
		{"with the key the joining open generated", issued, student, head + `"privateKey":"PRIV",` + place},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.TrimSpace(string(answer(t, session.Standing{Waiting: &tc.waiting}, tc.caller)))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
