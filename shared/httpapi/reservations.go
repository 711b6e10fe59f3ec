package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/reservation"
	"labkeep/shared/seating"
)

// ReservationDesk books, lists and cancels reservations
// (reservation.Desk).
type ReservationDesk interface {
	Book(ctx context.Context, r reservation.Reservation, by string) (reservation.Booked, error)
	List(ctx context.Context, from, to time.Time) ([]reservation.Booked, error)
	Cancel(ctx context.Context, id int64, courses []string) (reservation.Booked, error)
	// Timeline is each capacity bucket from from to to in spans of step,
	// with what the standing reservations hold in each.
	Timeline(ctx context.Context, from, to time.Time, step time.Duration) ([]reservation.Slot, error)
	// Rules are the timings the desk books under.
	Rules() reservation.Rules
}

// reservationJSON is a reservation as the API shows it.
type reservationJSON struct {
	ID       int64     `json:"id"`
	Course   string    `json:"course"`
	Lab      string    `json:"lab"`
	Seats    int       `json:"seats"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	BookedBy string    `json:"bookedBy"`
	BookedAt time.Time `json:"bookedAt"`
}

func reservationView(b reservation.Booked) reservationJSON {
	return reservationJSON{ID: b.ID, Course: b.Course, Lab: b.Lab, Seats: b.Seats, Start: b.Start, End: b.End, BookedBy: b.BookedBy, BookedAt: b.BookedAt}
}

// defaultListSpan is what GET /adminReservations lists without a range:
// from now for a week. Its timeline is given for ranges up to that long,
// an hour a slot.
const (
	defaultListSpan = 7 * 24 * time.Hour
	timelineStep    = time.Hour
)

// slotJSON is a span of a capacity bucket's timeline: capacity, what
// reservations hold at its busiest moment, what that leaves free, and,
// in the span that holds the present, what is in use now.
type slotJSON struct {
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Kind     labs.Kind `json:"kind"`
	Label    string    `json:"label"`
	Capacity int       `json:"capacity"`
	Reserved int       `json:"reserved"`
	Free     int       `json:"free"`
	Used     *int      `json:"used,omitempty"`
}

// timeline is desk's timeline from from to to (none for a range longer
// than defaultListSpan), with what is in use now in the slot that holds
// now when seats can say it.
func (a *API) timeline(ctx context.Context, desk ReservationDesk, from, to time.Time) ([]slotJSON, error) {
	out := []slotJSON{}
	if to.Sub(from) > defaultListSpan {
		return out, nil
	}
	slots, err := desk.Timeline(ctx, from, to, timelineStep)
	if err != nil {
		return nil, err
	}
	now := a.now().UTC()
	var inUse map[labs.Kind]int
	if a.seats != nil && !now.Before(from) && now.Before(to) {
		if inUse, err = a.seats.InUse(ctx); err != nil {
			// The reservations are still worth showing without it.
			a.log.Warn("timeline without what is in use now", "err", err)
			inUse = nil
		}
	}
	for _, sl := range slots {
		j := slotJSON{Start: sl.Start.UTC(), End: sl.End.UTC(), Kind: sl.Kind, Label: seating.Label(sl.Kind), Capacity: sl.Capacity, Reserved: sl.Reserved, Free: sl.Free()}
		if n, ok := inUse[sl.Kind]; ok && !now.Before(sl.Start) && now.Before(sl.End) {
			j.Used = &n
		}
		out = append(out, j)
	}
	return out, nil
}

// bookerCaller authenticates r and requires a role that books
// reservations, an admin or an instructor (401 or 403 written otherwise),
// returning the caller.
func (a *API) bookerCaller(w http.ResponseWriter, r *http.Request) (access.Principal, bool) {
	return a.callerWhere(w, r, access.Principal.Books, "the admin or instructor role")
}

// serveReservations registers the reservations' endpoints on mux: POST
// /adminReserve, GET /adminReservations and POST /adminCancelReservation
// for admins (every course) and instructors (the courses their token
// lists: access.Principal.Teaches), GET /reservations for a student's
// own classes.
func (a *API) serveReservations(mux *http.ServeMux, desk ReservationDesk) {
	mux.HandleFunc("/adminReserve", func(w http.ResponseWriter, r *http.Request) {
		p, ok := a.bookerCaller(w, r)
		if !ok {
			return
		}
		var body struct {
			Course string    `json:"course"`
			Lab    string    `json:"lab"`
			Seats  int       `json:"seats"`
			Start  time.Time `json:"start"`
			End    time.Time `json:"end"`
		}
		if err := decodeBody(w, r, &body, true); err != nil {
			a.writeError(w, r, err, nil)
			return
		}
		if !p.Teaches(body.Course) {
			taught := strings.Join(p.Taught(), ", ")
			if taught == "" {
				taught = "none"
			}
			a.writeErrorFor(w, r, p, fmt.Errorf("%w: an instructor books only the courses their token lists (%s), not %q", access.ErrForbidden, taught, body.Course), nil)
			return
		}
		b, err := desk.Book(r.Context(), reservation.Reservation{Course: body.Course, Lab: body.Lab, Seats: body.Seats, Start: body.Start, End: body.End}, p.Subject)
		if err != nil {
			a.writeErrorFor(w, r, p, err, nil)
			return
		}
		writeJSON(w, http.StatusCreated, map[string]any{"reservation": reservationView(b)})
	})
	// An instructor sees their own courses' reservations and the whole
	// timeline: the seats free are what they may book.
	mux.HandleFunc("/adminReservations", func(w http.ResponseWriter, r *http.Request) {
		p, ok := a.bookerCaller(w, r)
		if !ok {
			return
		}
		q := r.URL.Query()
		from, to := a.now().UTC(), time.Time{}
		for key := range q {
			var err error
			switch key {
			case "from":
				from, err = time.Parse(time.RFC3339, q.Get(key))
			case "to":
				to, err = time.Parse(time.RFC3339, q.Get(key))
			default:
				err = fmt.Errorf("unknown query parameter %q (allowed: from, to)", key)
			}
			if err != nil {
				a.writeErrorFor(w, r, p, fmt.Errorf("%w: %s: %v", access.ErrBadRequest, key, err), nil)
				return
			}
		}
		if to.IsZero() {
			to = from.Add(defaultListSpan)
		}
		list, err := desk.List(r.Context(), from, to)
		if err != nil {
			a.writeErrorFor(w, r, p, err, nil)
			return
		}
		out := []reservationJSON{}
		for _, b := range list {
			if p.Teaches(b.Course) {
				out = append(out, reservationView(b))
			}
		}
		slots, err := a.timeline(r.Context(), desk, from, to)
		if err != nil {
			a.writeErrorFor(w, r, p, err, nil)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"from": from.UTC(), "to": to.UTC(), "reservations": out, "timeline": slots})
	})
	// A student's own classes: the reservations of the courses whose
	// seats they take (access.Principal.SeatsIn) that have not ended, for
	// a week ahead, each with when its members are let in (start) and
	// until when their seats are held (heldUntil).
	mux.HandleFunc("/reservations", func(w http.ResponseWriter, r *http.Request) {
		p, ok := a.Authenticate(w, r)
		if !ok {
			return
		}
		if len(r.URL.Query()) > 0 {
			a.writeErrorFor(w, r, p, fmt.Errorf("%w: /reservations takes no query parameters", access.ErrBadRequest), nil)
			return
		}
		now := a.now().UTC()
		type class struct {
			Course    string    `json:"course"`
			Lab       string    `json:"lab"`
			Start     time.Time `json:"start"`
			End       time.Time `json:"end"`
			HeldUntil time.Time `json:"heldUntil"`
		}
		out := []class{}
		if seats := p.SeatsIn(); len(seats) > 0 {
			list, err := desk.List(r.Context(), now, now.Add(defaultListSpan))
			if err != nil {
				a.writeErrorFor(w, r, p, err, nil)
				return
			}
			for _, b := range list {
				if slices.Contains(seats, b.Course) {
					out = append(out, class{Course: b.Course, Lab: b.Lab, Start: b.Start, End: b.End, HeldUntil: desk.Rules().HeldUntil(b.Hold)})
				}
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"serverTime": now, "reservations": out})
	})
	mux.HandleFunc("/adminCancelReservation", func(w http.ResponseWriter, r *http.Request) {
		p, ok := a.bookerCaller(w, r)
		if !ok {
			return
		}
		var body struct {
			ID int64 `json:"id"`
		}
		if err := decodeBody(w, r, &body, true); err != nil {
			a.writeError(w, r, err, nil)
			return
		}
		if body.ID <= 0 {
			a.writeErrorFor(w, r, p, fmt.Errorf("%w: id is required (a reservation's, as /adminReservations lists it)", access.ErrBadRequest), nil)
			return
		}
		b, err := desk.Cancel(r.Context(), body.ID, p.Taught())
		if err != nil {
			a.writeErrorFor(w, r, p, err, nil)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"cancelled": reservationView(b)})
	})
}
