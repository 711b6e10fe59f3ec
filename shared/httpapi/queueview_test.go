package httpapi

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/access"
	"labkeep/shared/session"
)

// A queued session carries its place and ETA in whole seconds, rounded
// up (an ETA under a second is never shown as 0 while the wait is not
// over); any other session carries none of the three fields.
func TestViewQueuePlace(t *testing.T) {
	type place struct {
		Position       *int
		ETA, ETALatest *int64
	}
	pos := func(n int) *int { return &n }
	sec := func(n int64) *int64 { return &n }
	tests := []struct {
		name string
		sess session.Session
		want place
	}{
		{"queued, next in line", session.Session{Status: session.StatusQueued,
			Queue: session.Place{Position: 1, ETA: 1500 * time.Millisecond, ETALatest: 2 * time.Hour}},
			place{pos(1), sec(2), sec(7200)}},
		{"queued with room: ETA 0", session.Session{Status: session.StatusQueued, Queue: session.Place{Position: 1}},
			place{pos(1), sec(0), sec(0)}},
		{"running: no place", session.Session{Status: session.StatusRunning}, place{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := &API{now: func() time.Time { return time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC) }}
			v := a.view(tc.sess, access.Principal{Subject: "ann", Role: access.RoleStudent})
			if diff := cmp.Diff(tc.want, place{v.QueuePosition, v.ETASeconds, v.ETALatestSeconds}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
