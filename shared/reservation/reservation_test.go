package reservation

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
)

var t0 = time.Date(2026, 12, 7, 14, 0, 0, 0, time.UTC)

var rules = Rules{Lead: 10 * time.Minute, Release: 15 * time.Minute, MaxLength: 12 * time.Hour, MaxAhead: 30 * 24 * time.Hour}

// pods is a reservation of shell (one workspace Pod a seat) for course
// from start for length.
func pods(id int64, course string, seats int, start time.Time, length time.Duration) Hold {
	return Hold{Reservation: Reservation{ID: id, Course: course, Lab: "shell", Seats: seats, Start: start, End: start.Add(length)},
		Kind: labs.KindPod, PerSeat: 1}
}

func TestCheck(t *testing.T) {
	ok := Reservation{Course: "cs-101", Lab: "shell", Seats: 5, Start: t0, End: t0.Add(time.Hour)}
	now := t0.Add(-time.Hour)
	tests := map[string]struct {
		edit func(r *Reservation)
		want string // "" accepted; else in the message
	}{
		"a course's seats for an hour ahead":       {func(r *Reservation) {}, ""},
		"starting this minute (the clocks' slack)": {func(r *Reservation) { r.Start = now.Add(-30 * time.Second) }, ""},
		"no course":                     {func(r *Reservation) { r.Course = "" }, "course"},
		"a course with a space":         {func(r *Reservation) { r.Course = "cs 101" }, "course"},
		"no seats":                      {func(r *Reservation) { r.Seats = 0 }, "seats must be 1 to 10000, got 0"},
		"negative seats":                {func(r *Reservation) { r.Seats = -2 }, "seats must be 1 to 10000, got -2"},
		"more seats than any sum holds": {func(r *Reservation) { r.Seats = 1 << 62 }, "seats must be 1 to 10000"},
		"ending before it starts":       {func(r *Reservation) { r.End = r.Start.Add(-time.Minute) }, "must end after it starts"},
		"ending as it starts":           {func(r *Reservation) { r.End = r.Start }, "must end after it starts"},
		"longer than MaxLength":         {func(r *Reservation) { r.End = r.Start.Add(13 * time.Hour) }, "longer than the 12h0m0s"},
		"in the past":                   {func(r *Reservation) { r.Start, r.End = now.Add(-2*time.Hour), now.Add(-time.Hour) }, "in the past"},
		"started an hour ago":           {func(r *Reservation) { r.Start = now.Add(-time.Hour) }, "in the past"},
		"more than MaxAhead from now":   {func(r *Reservation) { r.Start, r.End = now.Add(31*24*time.Hour), now.Add(31*24*time.Hour+time.Hour) }, "ahead"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := ok
			tc.edit(&r)
			err := Check(r, now, rules)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v; want ErrInvalid saying %q", err, tc.want)
			}
		})
	}
}

func TestBook(t *testing.T) {
	vm := func(id int64, seats, perSeat int, start time.Time, length time.Duration) Hold {
		h := pods(id, "net-201", seats, start, length)
		h.Lab, h.Kind, h.PerSeat = "net", labs.KindVM, perSeat
		return h
	}
	tests := map[string]struct {
		h        Hold
		existing []Hold
		limit    int
		lead     time.Duration
		want     string // "" booked; else in ErrOverbooked's message
	}{
		"alone, within the capacity": {pods(9, "c", 5, t0, time.Hour), nil, 8, 0, ""},
		"alone, the whole capacity":  {pods(9, "c", 8, t0, time.Hour), nil, 8, 0, ""},
		"alone, past the capacity":   {pods(9, "c", 9, t0, time.Hour), nil, 8, 0, "9 seats of lab shell asked for, 8 free"},
		"beside one that overlaps, together within": {
			pods(9, "c", 3, t0.Add(30*time.Minute), time.Hour), []Hold{pods(1, "a", 5, t0, time.Hour)}, 8, 0, ""},
		"beside one that overlaps, together past: names the free seats": {
			pods(9, "c", 4, t0.Add(30*time.Minute), time.Hour), []Hold{pods(1, "a", 5, t0, time.Hour)}, 8, 0,
			"4 seats of lab shell asked for, 3 free from 2026-12-07T14:30:00Z to 2026-12-07T15:30:00Z (the capacity is 8, 5 of it reserved at the busiest moment)"},
		"back to back (one ends as the other starts): both fit": {
			pods(9, "c", 8, t0.Add(time.Hour), time.Hour), []Hold{pods(1, "a", 8, t0, time.Hour)}, 8, 0, ""},
		"two that never overlap each other, both inside its window: the busiest moment counts, not their sum": {
			pods(9, "c", 3, t0, 3*time.Hour), []Hold{pods(1, "a", 5, t0, time.Hour), pods(2, "b", 5, t0.Add(2*time.Hour), time.Hour)}, 8, 0, ""},
		"one starting inside its window makes the peak": {
			pods(9, "c", 3, t0, 3*time.Hour), []Hold{pods(1, "a", 2, t0, 3*time.Hour), pods(2, "b", 4, t0.Add(2*time.Hour), time.Hour)}, 8, 0,
			"3 seats of lab shell asked for, 2 free"},
		"another bucket's reservation takes nothing from this one": {
			pods(9, "c", 8, t0, time.Hour), []Hold{vm(1, 4, 2, t0, time.Hour)}, 8, 0, ""},
		"a VM lab's seats count in VMs: two VMs a seat": {
			vm(9, 4, 2, t0, time.Hour), []Hold{vm(1, 1, 2, t0, time.Hour)}, 8, 0, "4 seats of lab net asked for, 3 free"},
		"back to back, but the second's seats are held from its lead, while the first runs: refused": {
			pods(9, "c", 8, t0.Add(15*time.Minute), 45*time.Minute), []Hold{pods(1, "a", 8, t0, 10*time.Minute)}, 8, 10 * time.Minute, "8 seats of lab shell asked for, 0 free"},
		"the first ends before the second's lead: both fit": {
			pods(9, "c", 8, t0.Add(20*time.Minute), 40*time.Minute), []Hold{pods(1, "a", 8, t0, 10*time.Minute)}, 8, 10 * time.Minute, ""},
		"one booked later whose lead reaches into this one: counted": {
			pods(9, "c", 8, t0, 10*time.Minute), []Hold{pods(1, "a", 8, t0.Add(15*time.Minute), time.Hour)}, 8, 10 * time.Minute, "0 free"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := Book(tc.h, tc.existing, tc.limit, tc.lead)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (!errors.Is(err, ErrOverbooked) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v; want ErrOverbooked saying %q", err, tc.want)
			}
		})
	}
}

func TestHeldAndSeatFor(t *testing.T) {
	class := pods(1, "cs-101", 5, t0, time.Hour)
	other := pods(2, "net-201", 2, t0, time.Hour)
	other.Lab = "router"
	holds := []Hold{class, other}
	type got struct {
		Held int
		Seat int64 // the reservation SeatFor gives cs-101's member opening shell, 0 for none
	}
	tests := map[string]struct {
		now  time.Time
		uses map[int64]Use
		want got
	}{
		"before the lead: nothing held, no seat":                        {t0.Add(-11 * time.Minute), nil, got{0, 0}},
		"in the lead: every seat held, members not let in yet":          {t0.Add(-10 * time.Minute), nil, got{7, 0}},
		"at the start: held, and a member takes a seat":                 {t0, nil, got{7, 1}},
		"seats taken are no longer held":                                {t0.Add(time.Minute), map[int64]Use{1: {Taken: 3}}, got{4, 1}},
		"every seat of the class taken: no seat for one more member":    {t0.Add(time.Minute), map[int64]Use{1: {Taken: 5}}, got{2, 0}},
		"more taken than booked (opens raced): held never negative":     {t0.Add(time.Minute), map[int64]Use{1: {Taken: 7}}, got{2, 0}},
		"the class's warm instances hold their seats, still a member's": {t0.Add(time.Minute), map[int64]Use{1: {Taken: 1, Pooled: 4}}, got{2, 1}},
		"the release: nothing held, the member is in the general line":  {t0.Add(15 * time.Minute), map[int64]Use{1: {Taken: 1}}, got{0, 0}},
		"after the end: nothing held":                                   {t0.Add(2 * time.Hour), nil, got{0, 0}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := got{Held: Held(tc.now, holds, tc.uses, labs.KindPod, rules)}
			if h, ok := SeatFor(tc.now, holds, tc.uses, []string{"cs-101", "math"}, "shell", rules); ok {
				g.Seat = h.ID
			}
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	t.Run("not a member, or another lab: no seat", func(t *testing.T) {
		if h, ok := SeatFor(t0, holds, nil, []string{"math"}, "shell", rules); ok {
			t.Errorf("a student of math got a seat of %s", h.Course)
		}
		if h, ok := SeatFor(t0, holds, nil, []string{"cs-101"}, "router", rules); ok {
			t.Errorf("a member of cs-101 opening router got a seat of %s", h.Course)
		}
	})
	t.Run("of two of the member's reservations, the one ending first", func(t *testing.T) {
		late := pods(3, "math", 2, t0, 2*time.Hour)
		if h, ok := SeatFor(t0, append(holds, late), nil, []string{"math", "cs-101"}, "shell", rules); !ok || h.ID != 1 {
			t.Errorf("SeatFor = %d, %v; want reservation 1 (ends first)", h.ID, ok)
		}
	})
	t.Run("another bucket's reservations hold nothing here", func(t *testing.T) {
		if got := Held(t0, holds, nil, labs.KindVM, rules); got != 0 {
			t.Errorf("VMs held: %d", got)
		}
	})
}

func TestPoolTarget(t *testing.T) {
	class := pods(1, "cs-101", 5, t0, time.Hour)
	tests := map[string]struct {
		now  time.Time
		use  Use
		want int
	}{
		"before the lead: none":                        {t0.Add(-11 * time.Minute), Use{}, 0},
		"from the lead: one for every seat":            {t0.Add(-10 * time.Minute), Use{}, 5},
		"instances made already count toward it":       {t0.Add(-5 * time.Minute), Use{Pooled: 5}, 5},
		"seats members took need none":                 {t0.Add(time.Minute), Use{Taken: 2, Pooled: 3}, 3},
		"every seat taken: none":                       {t0.Add(time.Minute), Use{Taken: 5}, 0},
		"more taken than booked: none, never negative": {t0.Add(time.Minute), Use{Taken: 6}, 0},
		"the release: none, the seats go to everyone":  {t0.Add(15 * time.Minute), Use{Pooled: 2}, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := rules.PoolTarget(class, tc.use, tc.now); got != tc.want {
				t.Errorf("PoolTarget = %d, want %d", got, tc.want)
			}
		})
	}
}
