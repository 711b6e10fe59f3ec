package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
	"labkeep/shared/reservation"
	"labkeep/shared/session"
)

// deskLabs is the catalog the desk books from: shell (one workspace Pod a
// seat) and a two-VM lab.
type deskLabs map[string]labs.Lab

func (c deskLabs) Get(name string) (labs.Lab, bool) { l, ok := c[name]; return l, ok }
func (c deskLabs) Names() []string                  { return []string{"net", "shell"} }

// Bookings on the real database: twenty instructors booking 3 seats of
// an 8-seat capacity for overlapping windows at once get exactly two
// bookings (24 seats would be promised without the lock), the others
// ErrOverbooked naming the 2 seats left; a cancelled reservation frees
// its seats at once; a refused or bad booking stores nothing; another
// bucket's capacity is its own.
func TestBookingsNeverPassTheCapacity(t *testing.T) {
	ctx := context.Background()
	pg := openStore(t)
	catalog := deskLabs{
		"shell": {Name: "shell", Kind: labs.KindPod, Nodes: []labs.Node{{Name: "w"}}},
		"net":   {Name: "net", Kind: labs.KindVM, Nodes: []labs.Node{{Name: "a"}, {Name: "b"}}},
	}
	capacity := func(l labs.Lab) (labs.Kind, int, int) { return l.Kind, len(l.Nodes), 8 }
	now := t0
	desk := reservation.NewDesk(pg, catalog, capacity, reservation.DefaultRules(), func() time.Time { return now })
	start := t0.Add(24 * time.Hour)

	var wg sync.WaitGroup
	var mu sync.Mutex
	var booked []int64
	var refusals []string
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := desk.Book(ctx, reservation.Reservation{Course: fmt.Sprintf("c-%d", i), Lab: "shell", Seats: 3,
				Start: start.Add(time.Duration(i) * time.Minute), End: start.Add(time.Hour)}, "instructor")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				booked = append(booked, b.ID)
			case errors.Is(err, reservation.ErrOverbooked):
				refusals = append(refusals, err.Error())
			default:
				t.Errorf("Book: %v", err)
			}
		}()
	}
	wg.Wait()
	if len(booked) != 2 || len(refusals) != 18 {
		t.Fatalf("%d booked, %d overbooked; want 2 and 18", len(booked), len(refusals))
	}
	for _, r := range refusals {
		if !strings.Contains(r, "3 seats of lab shell asked for, 2 free") {
			t.Errorf("a refusal says %q; want it to name the 2 seats free", r)
		}
	}
	list := func() []int64 {
		t.Helper()
		all, err := desk.List(ctx, start, start.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, b := range all {
			ids = append(ids, b.ID)
		}
		return ids
	}
	if got := list(); len(got) != 2 {
		t.Errorf("standing reservations: %v; want the two booked", got)
	}

	// Another bucket: 4 seats of the two-VM lab take all 8 VMs.
	if _, err := desk.Book(ctx, reservation.Reservation{Course: "net-201", Lab: "net", Seats: 4, Start: start, End: start.Add(time.Hour)}, "instructor"); err != nil {
		t.Errorf("booking the VM lab beside full Pod seats: %v", err)
	}
	before := list()
	for name, tc := range map[string]struct {
		r    reservation.Reservation
		want error
	}{
		"unknown lab":  {reservation.Reservation{Course: "c", Lab: "nope", Seats: 1, Start: start, End: start.Add(time.Hour)}, session.ErrUnknownLab},
		"no seats":     {reservation.Reservation{Course: "c", Lab: "shell", Seats: 0, Start: start, End: start.Add(time.Hour)}, reservation.ErrInvalid},
		"end first":    {reservation.Reservation{Course: "c", Lab: "shell", Seats: 1, Start: start, End: start.Add(-time.Hour)}, reservation.ErrInvalid},
		"in the past":  {reservation.Reservation{Course: "c", Lab: "shell", Seats: 1, Start: t0.Add(-2 * time.Hour), End: t0.Add(-time.Hour)}, reservation.ErrInvalid},
		"one too many": {reservation.Reservation{Course: "c", Lab: "shell", Seats: 3, Start: start, End: start.Add(time.Hour)}, reservation.ErrOverbooked},
		"one more VM":  {reservation.Reservation{Course: "c", Lab: "net", Seats: 1, Start: start.Add(30 * time.Minute), End: start.Add(2 * time.Hour)}, reservation.ErrOverbooked},
	} {
		if _, err := desk.Book(ctx, tc.r, "instructor"); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v; want %v", name, err, tc.want)
		}
	}
	if diff := cmp.Diff(before, list()); diff != "" {
		t.Errorf("refused bookings changed the reservations (-before +after):\n%s", diff)
	}

	// An instructor cancels only their own courses' reservations: one of
	// another course, or by an instructor of none, is not found and
	// stands.
	for _, courses := range [][]string{{"net-201", "math-7"}, {}} {
		if _, err := desk.Cancel(ctx, booked[0], courses); !errors.Is(err, reservation.ErrNoReservation) {
			t.Errorf("cancelling reservation %d as an instructor of %v: %v; want ErrNoReservation", booked[0], courses, err)
		}
	}
	if diff := cmp.Diff(before, list()); diff != "" {
		t.Errorf("another course's instructor changed the reservations (-before +after):\n%s", diff)
	}
	all, err := desk.List(ctx, start, start.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var course string
	for _, b := range all {
		if b.ID == booked[0] {
			course = b.Course
		}
	}
	// A cancel frees its seats at once (here by the course's instructor);
	// a second cancel (here an admin's) finds none.
	if _, err := desk.Cancel(ctx, booked[0], []string{"math-7", course}); err != nil {
		t.Fatal(err)
	}
	if _, err := desk.Cancel(ctx, booked[0], nil); !errors.Is(err, reservation.ErrNoReservation) {
		t.Errorf("cancelling it again: %v; want ErrNoReservation", err)
	}
	// An admin cancels any course's.
	if b, err := desk.Cancel(ctx, booked[1], nil); err != nil || b.ID != booked[1] {
		t.Errorf("an admin cancelling reservation %d = %d, %v", booked[1], b.ID, err)
	}
	if _, err := desk.Book(ctx, reservation.Reservation{Course: "late", Lab: "shell", Seats: 3, Start: start, End: start.Add(time.Hour)}, "instructor"); err != nil {
		t.Errorf("booking the freed seats: %v", err)
	}
}
