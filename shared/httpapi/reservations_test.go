package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/reservation"
	"labkeep/shared/seating"
	"labkeep/shared/session"
)

// slotsDesk is a desk whose Timeline is every hour of the range, 2 of 8
// VMs reserved.
type slotsDesk struct{ ReservationDesk }

func (slotsDesk) List(context.Context, time.Time, time.Time) ([]reservation.Booked, error) {
	return nil, nil
}

func (slotsDesk) Timeline(_ context.Context, from, to time.Time, step time.Duration) ([]reservation.Slot, error) {
	var out []reservation.Slot
	for s := from; s.Before(to); s = s.Add(step) {
		out = append(out, reservation.Slot{Start: s, End: s.Add(step), Kind: labs.KindVM, Capacity: 8, Reserved: 2})
	}
	return out, nil
}

// inUse is seats that count 3 VMs in use, or fail with err.
type inUse struct {
	Seats
	err error
}

func (u inUse) InUse(context.Context) (map[labs.Kind]int, error) {
	return map[labs.Kind]int{labs.KindVM: 3, labs.KindPod: 0}, u.err
}

// GET /adminReservations' timeline: a slot per hour with its capacity,
// reserved and free; what is in use now only in the hour that holds the
// present, and nowhere when it cannot be counted (the timeline is still
// given); no timeline for a range over a week.
func TestReservationsTimeline(t *testing.T) {
	now := time.Date(2026, 12, 7, 14, 20, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	secret := []byte("timeline-test-secret-0123456789abcdef")
	admin, err := access.Sign(secret, "ops", access.RoleAdmin, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	type slot struct {
		Start    time.Time `json:"start"`
		Label    string    `json:"label"`
		Reserved int       `json:"reserved"`
		Free     int       `json:"free"`
		Used     *int      `json:"used"`
	}
	three := 3
	at := func(h int) time.Time { return time.Date(2026, 12, 7, h, 0, 0, 0, time.UTC) }
	tests := []struct {
		name  string
		query string
		seats Seats
		want  []slot
	}{
		{"today from 13:00 to 16:00: in use in the 14:00 hour only", "?from=2026-12-07T13:00:00Z&to=2026-12-07T16:00:00Z", inUse{},
			[]slot{{at(13), "VMs", 2, 6, nil}, {at(14), "VMs", 2, 6, &three}, {at(15), "VMs", 2, 6, nil}}},
		{"a range that does not hold the present: never in use", "?from=2026-12-08T09:00:00Z&to=2026-12-08T10:00:00Z", inUse{},
			[]slot{{time.Date(2026, 12, 8, 9, 0, 0, 0, time.UTC), "VMs", 2, 6, nil}}},
		{"the count fails: the timeline without it", "?from=2026-12-07T14:00:00Z&to=2026-12-07T15:00:00Z", inUse{err: errors.New("apiserver down")},
			[]slot{{at(14), "VMs", 2, 6, nil}}},
		{"a range over a week: no timeline", "?from=2026-12-07T00:00:00Z&to=2026-12-15T00:00:00Z", inUse{}, []slot{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := New(Options{Sessions: &session.Service{}, Seats: tc.seats, Auth: access.NewAuthenticator(secret, clock), Now: clock,
				Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Reservations: slotsDesk{}})
			req := httptest.NewRequest("GET", "/adminReservations"+tc.query, nil)
			req.Header.Set("Authorization", "Bearer "+admin)
			w := httptest.NewRecorder()
			a.ServeHTTP(w, req)
			var got struct {
				Timeline []slot `json:"timeline"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != 200 {
				t.Fatalf("adminReservations = %d %s (%v)", w.Code, w.Body, err)
			}
			if diff := cmp.Diff(tc.want, got.Timeline); diff != "" {
				t.Errorf("timeline (-want +got):\n%s", diff)
			}
		})
	}
}

var _ Seats = (*seating.Usher)(nil)
