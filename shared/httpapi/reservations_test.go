package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
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

// bookDesk is a desk holding one reservation of cs-101 and one of
// math-7 that records what it was asked to book and cancel.
type bookDesk struct {
	slotsDesk
	booked    []string
	cancelled [][]string
}

func (d *bookDesk) Book(_ context.Context, r reservation.Reservation, by string) (reservation.Booked, error) {
	d.booked = append(d.booked, r.Course)
	return reservation.Booked{Hold: reservation.Hold{Reservation: r}, BookedBy: by}, nil
}

func (d *bookDesk) List(context.Context, time.Time, time.Time) ([]reservation.Booked, error) {
	return []reservation.Booked{
		{Hold: reservation.Hold{Reservation: reservation.Reservation{ID: 1, Course: "cs-101", Lab: "net", Seats: 5}}},
		{Hold: reservation.Hold{Reservation: reservation.Reservation{ID: 2, Course: "math-7", Lab: "net", Seats: 2}}},
	}, nil
}

func (d *bookDesk) Cancel(_ context.Context, id int64, courses []string) (reservation.Booked, error) {
	d.cancelled = append(d.cancelled, courses)
	return reservation.Booked{Hold: reservation.Hold{Reservation: reservation.Reservation{ID: id}}}, nil
}

// Who books which course: an admin any course's reservations, an
// instructor only their own courses' (the others' are refused before the
// desk is asked, not listed, and a cancel is scoped to theirs), a student
// none.
func TestReservationsByRole(t *testing.T) {
	now := time.Date(2026, 12, 7, 14, 20, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	secret := []byte("byrole-test-secret-0123456789abcdef")
	rules := access.DefaultTokenRules()
	token := func(sub, role string, courses ...string) string {
		t.Helper()
		tok, err := rules.Issue(secret, sub, role, now, courses...)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	admin, prof, nobody, ann := token("ops", access.RoleAdmin), token("prof", access.RoleInstructor, "cs-101"),
		token("new-prof", access.RoleInstructor), token("ann", access.RoleStudent, "cs-101")
	book := func(course string) string {
		return `{"course":"` + course + `","lab":"net","seats":1,"start":"2026-12-08T10:00:00Z","end":"2026-12-08T11:00:00Z"}`
	}
	type got struct {
		Status    int
		Error     string
		Listed    []string
		Booked    []string
		Cancelled [][]string
	}
	tests := []struct {
		name, method, path, token, body string
		want                            got
	}{
		{"an admin books any course", "POST", "/adminReserve", admin, book("math-7"), got{Status: 201, Booked: []string{"math-7"}}},
		{"an instructor books their course", "POST", "/adminReserve", prof, book("cs-101"), got{Status: 201, Booked: []string{"cs-101"}}},
		{"an instructor books another course", "POST", "/adminReserve", prof, book("math-7"),
			got{Status: 403, Error: `forbidden: an instructor books only the courses their token lists (cs-101), not "math-7"`}},
		{"an instructor of no course books", "POST", "/adminReserve", nobody, book("cs-101"),
			got{Status: 403, Error: `forbidden: an instructor books only the courses their token lists (none), not "cs-101"`}},
		{"a student of the course books", "POST", "/adminReserve", ann, book("cs-101"),
			got{Status: 403, Error: "forbidden: /adminReserve needs the admin or instructor role"}},
		{"an admin lists every course's", "GET", "/adminReservations", admin, "", got{Status: 200, Listed: []string{"cs-101", "math-7"}}},
		{"an instructor lists their course's", "GET", "/adminReservations", prof, "", got{Status: 200, Listed: []string{"cs-101"}}},
		{"an instructor of no course lists none", "GET", "/adminReservations", nobody, "", got{Status: 200, Listed: []string{}}},
		{"a student lists", "GET", "/adminReservations", ann, "", got{Status: 403, Error: "forbidden: /adminReservations needs the admin or instructor role"}},
		{"an admin cancels among every course's", "POST", "/adminCancelReservation", admin, `{"id":2}`, got{Status: 200, Cancelled: [][]string{nil}}},
		{"an instructor cancels among their course's", "POST", "/adminCancelReservation", prof, `{"id":2}`, got{Status: 200, Cancelled: [][]string{{"cs-101"}}}},
		{"a student cancels", "POST", "/adminCancelReservation", ann, `{"id":1}`,
			got{Status: 403, Error: "forbidden: /adminCancelReservation needs the admin or instructor role"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			desk := &bookDesk{}
			a := New(Options{Sessions: &session.Service{}, Auth: access.NewAuthenticator(secret, clock), Now: clock,
				Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Reservations: desk})
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+tc.token)
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			w := httptest.NewRecorder()
			a.ServeHTTP(w, req)
			var body struct {
				Error struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
				Reservations []struct {
					Course string `json:"course"`
				} `json:"reservations"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatalf("%d %s: %v", w.Code, w.Body, err)
			}
			g := got{Status: w.Code, Booked: desk.booked, Cancelled: desk.cancelled}
			if body.Error.Code != "" {
				g.Error = body.Error.Message
			}
			if body.Reservations != nil {
				g.Listed = []string{}
				for _, r := range body.Reservations {
					g.Listed = append(g.Listed, r.Course)
				}
			}
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
