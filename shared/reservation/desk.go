package reservation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// Booked is a reservation as stored: its hold, who booked it and when,
// and when it was cancelled (zero while it stands).
type Booked struct {
	Hold
	BookedBy    string
	BookedAt    time.Time
	CancelledAt time.Time
}

// ErrNoReservation: no standing reservation of that id.
var ErrNoReservation = errors.New("no_reservation")

// Store is what the desk needs of the database.
type Store interface {
	// Reserve reads the standing reservations whose windows overlap from
	// to to, runs decide on them and, if it returns nil, stores b and
	// returns it with its ID: all under one lock every booking of the
	// environment takes, so two bookings never both fit where only one
	// does. decide's error is returned as it is.
	Reserve(ctx context.Context, b Booked, from, to time.Time, decide func(overlapping []Hold) error) (Booked, error)
	// Reservations lists the standing reservations whose windows overlap
	// from to to, by start.
	Reservations(ctx context.Context, from, to time.Time) ([]Booked, error)
	// Cancel ends standing reservation id at at and returns it, if it is
	// of one of courses (nil: of any course); ErrNoReservation if there
	// is none.
	Cancel(ctx context.Context, id int64, courses []string, at time.Time) (Booked, error)
}

// Catalog is the labs a reservation may name.
type Catalog interface {
	Get(name string) (labs.Lab, bool)
	Names() []string
}

// Capacity is what one seat of a lab takes and from which bucket, and
// that bucket's limit (seating.CapacityOf under the platform's limits).
type Capacity func(lab labs.Lab) (kind labs.Kind, perSeat, limit int)

// Desk books and cancels reservations: the rules of Check and Book over
// the Store, with the lab's capacity from the catalog.
type Desk struct {
	store    Store
	labs     Catalog
	capacity Capacity
	rules    Rules
	now      func() time.Time
}

// NewDesk returns a Desk; now is its clock.
func NewDesk(store Store, catalog Catalog, capacity Capacity, rules Rules, now func() time.Time) *Desk {
	return &Desk{store: store, labs: catalog, capacity: capacity, rules: rules, now: now}
}

// Rules are the timings the desk books under.
func (d *Desk) Rules() Rules { return d.rules }

// Book books r for by: session.ErrUnknownLab for a lab the catalog does
// not have, ErrInvalid for a reservation Check refuses, ErrOverbooked when
// it does not fit beside the standing ones. Nothing is stored then.
func (d *Desk) Book(ctx context.Context, r Reservation, by string) (Booked, error) {
	lab, ok := d.labs.Get(r.Lab)
	if !ok {
		return Booked{}, fmt.Errorf("%w %q; valid labs: %s", session.ErrUnknownLab, r.Lab, strings.Join(d.labs.Names(), ", "))
	}
	now := d.now().UTC()
	r.Start, r.End = r.Start.UTC(), r.End.UTC()
	if err := Check(r, now, d.rules); err != nil {
		return Booked{}, err
	}
	kind, per, limit := d.capacity(lab)
	h := Hold{Reservation: r, Kind: kind, PerSeat: per}
	// Every reservation whose held window (from Lead before its start)
	// meets h's.
	from, to := r.Start.Add(-d.rules.Lead), r.End.Add(d.rules.Lead)
	return d.store.Reserve(ctx, Booked{Hold: h, BookedBy: by, BookedAt: now}, from, to, func(overlapping []Hold) error {
		return Book(h, overlapping, limit, d.rules.Lead)
	})
}

// Cancel cancels reservation id now, if it is of one of courses (nil: of
// any course, as an admin cancels): its seats are free at once.
// ErrNoReservation if there is no such standing reservation, so a
// reservation of another course looks like none.
func (d *Desk) Cancel(ctx context.Context, id int64, courses []string) (Booked, error) {
	return d.store.Cancel(ctx, id, courses, d.now().UTC())
}

// List lists the standing reservations whose windows overlap from to to.
func (d *Desk) List(ctx context.Context, from, to time.Time) ([]Booked, error) {
	if !to.After(from) {
		return nil, fmt.Errorf("%w: the range must end after it starts (%s to %s)", ErrInvalid, stamp(from), stamp(to))
	}
	return d.store.Reservations(ctx, from, to)
}

// Timeline is the capacity of every bucket the catalog's labs use, from
// from to to in spans of step, with what the standing reservations hold
// in each (Timeline).
func (d *Desk) Timeline(ctx context.Context, from, to time.Time, step time.Duration) ([]Slot, error) {
	caps := map[labs.Kind]int{}
	for _, name := range d.labs.Names() {
		if lab, ok := d.labs.Get(name); ok {
			kind, _, limit := d.capacity(lab)
			caps[kind] = limit
		}
	}
	// A reservation takes capacity from its lead: one starting up to Lead
	// after to already holds seats before to.
	booked, err := d.List(ctx, from, to.Add(d.rules.Lead))
	if err != nil {
		return nil, err
	}
	holds := make([]Hold, len(booked))
	for i, b := range booked {
		holds[i] = b.Hold
	}
	return Timeline(holds, caps, from, to, step, d.rules.Lead), nil
}
