// Package reservation is a course's seats for a time slot: the pure rules
// for booking them (never more reserved than the capacity, at any
// moment), for holding their unused seats for the course while the slot
// comes and runs, and for releasing the seats nobody took once its
// grace has passed. Admission (seating.Decide) and the warm pool read
// what these rules say; nothing here reads a clock, a database or the
// cluster.
package reservation

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"time"

	"labkeep/shared/labs"
	"labkeep/shared/setting"
)

// Reservation is Seats of lab Lab held for the members of Course from
// Start to End.
type Reservation struct {
	ID     int64
	Course string
	Lab    string
	Seats  int
	Start  time.Time
	End    time.Time
}

// Hold is a reservation with what it takes from the capacity: each seat
// takes PerSeat of bucket Kind (seating.CapacityOf its lab).
type Hold struct {
	Reservation
	Kind    labs.Kind
	PerSeat int
}

// units is what all of h's seats take.
func (h Hold) units() int { return h.Seats * h.PerSeat }

// Rules are the timings every reservation follows.
type Rules struct {
	// Lead: a reservation's seats are held this long before its start,
	// so that the labs of students who open just before do not take the
	// class's capacity.
	Lead time.Duration
	// Release: seats nobody took this long after the start are released
	// to everyone.
	Release time.Duration
	// MaxLength is the longest window a reservation may have.
	MaxLength time.Duration
	// MaxAhead is how far ahead a reservation may start.
	MaxAhead time.Duration
}

// DefaultRules are the timings unless a platform says otherwise.
func DefaultRules() Rules {
	return Rules{Lead: 10 * time.Minute, Release: 15 * time.Minute, MaxLength: 12 * time.Hour, MaxAhead: 180 * 24 * time.Hour}
}

// Validate reports timings no reservation could follow.
func (r Rules) Validate() error {
	var errs []error
	if r.Lead < 0 {
		errs = append(errs, setting.Invalid("Lead", "must not be negative, got %s", r.Lead))
	}
	return errors.Join(append(errs,
		setting.Positive("Release", r.Release),
		setting.Positive("MaxLength", r.MaxLength),
		setting.Positive("MaxAhead", r.MaxAhead))...)
}

// The errors of a reservation that cannot be made; each says why in its
// message.
var (
	// ErrInvalid: the reservation itself is wrong (its course, seats or
	// window).
	ErrInvalid = errors.New("bad_reservation")
	// ErrOverbooked: with it, more than the capacity would be reserved at
	// some moment of its window.
	ErrOverbooked = errors.New("overbooked")
)

// MaxSeats is the most seats one reservation may hold: more than any
// platform's capacity, and small enough that no sum of them overflows.
const MaxSeats = 10000

// courseName is what a course may be called: the value of the JWT claim
// that lists a student's courses.
var courseName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$`)

// Check says what is wrong with r as a new reservation at now (nil if
// nothing): a course name, at least one seat, an end after its start, no
// longer than MaxLength, starting no earlier than now (a minute's slack
// for the clocks of the one who books) and no later than MaxAhead. The
// lab is the catalog's to check.
func Check(r Reservation, now time.Time, rules Rules) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	switch {
	case !courseName.MatchString(r.Course):
		return bad("course %q must be 1 to 128 letters, digits and . _ : / @ -, starting with a letter or digit", r.Course)
	case r.Seats < 1 || r.Seats > MaxSeats:
		return bad("seats must be 1 to %d, got %d", MaxSeats, r.Seats)
	case !r.End.After(r.Start):
		return bad("the window must end after it starts (%s to %s)", stamp(r.Start), stamp(r.End))
	case r.End.Sub(r.Start) > rules.MaxLength:
		return bad("the window lasts %s, longer than the %s a reservation may", r.End.Sub(r.Start), rules.MaxLength)
	case r.Start.Before(now.Add(-time.Minute)):
		return bad("the window starts at %s, in the past (now is %s)", stamp(r.Start), stamp(now))
	case r.Start.After(now.Add(rules.MaxAhead)):
		return bad("the window starts at %s, more than %s ahead", stamp(r.Start), rules.MaxAhead)
	}
	return nil
}

// Book says whether h fits beside the reservations already made: at no
// moment may the seats reserved in its bucket, h's included, take more
// than limit, each reservation counted from lead before its start (when
// its seats start to be held) to its end. ErrOverbooked says how many
// seats of h's lab are free over the whole window.
func Book(h Hold, existing []Hold, limit int, lead time.Duration) error {
	peak := Peak(heldFromLead(existing, lead), h.Kind, h.Start.Add(-lead), h.End)
	if peak+h.units() <= limit {
		return nil
	}
	free := 0
	if h.PerSeat > 0 && limit > peak {
		free = (limit - peak) / h.PerSeat
	}
	return fmt.Errorf("%w: %d seats of lab %s asked for, %d free from %s to %s (the capacity is %d, %d of it reserved at the busiest moment)",
		ErrOverbooked, h.Seats, h.Lab, free, stamp(h.Start), stamp(h.End), limit, peak)
}

// Peak is the most that holds of bucket kind reserve together at any
// moment from from to to.
func Peak(holds []Hold, kind labs.Kind, from, to time.Time) int {
	// The sum only changes where a window starts or ends: look at from
	// and at every start inside.
	moments := []time.Time{from}
	for _, h := range holds {
		if h.Kind == kind && h.Start.After(from) && h.Start.Before(to) {
			moments = append(moments, h.Start)
		}
	}
	peak := 0
	for _, t := range moments {
		sum := 0
		for _, h := range holds {
			if h.Kind == kind && !t.Before(h.Start) && t.Before(h.End) {
				sum += h.units()
			}
		}
		peak = max(peak, sum)
	}
	return peak
}

// HeldUntil is when h's seats nobody took stop being held: Release
// after its start, or its end when that comes first.
func (r Rules) HeldUntil(h Hold) time.Time {
	if released := h.Start.Add(r.Release); released.Before(h.End) {
		return released
	}
	return h.End
}

// Holding reports whether h holds its unused seats at now: from Lead
// before its start until HeldUntil.
func (r Rules) Holding(h Hold, now time.Time) bool {
	return !now.Before(h.Start.Add(-r.Lead)) && now.Before(r.HeldUntil(h))
}

// Use is how live sessions use one reservation's seats: Taken by its
// members' sessions, Pooled by the class's warm instances, made from its
// lead for members to claim (PoolTarget). Both hold capacity as live
// sessions do; only a taken seat is a member's.
type Use struct {
	Taken, Pooled int
}

// inUse is the seats live sessions hold either way.
func (u Use) inUse() int { return u.Taken + u.Pooled }

// Held is what the reservations of bucket kind hold at now that no live
// session holds: the capacity only their courses' members may use (a
// class's warm instance already holds its seat's capacity). uses are the
// reservations' seats in use, by ID.
func Held(now time.Time, holds []Hold, uses map[int64]Use, kind labs.Kind, rules Rules) int {
	held := 0
	for _, h := range holds {
		if h.Kind == kind && rules.Holding(h, now) {
			held += max(0, h.Seats-uses[h.ID].inUse()) * h.PerSeat
		}
	}
	return held
}

// PoolTarget is how many warm instances h's class should have at now:
// one for each seat no member took, while h holds its seats (from Lead
// before its start, so they are ready when it starts, until HeldUntil);
// none after, when its seats go to everyone.
func (r Rules) PoolTarget(h Hold, use Use, now time.Time) int {
	if !r.Holding(h, now) {
		return 0
	}
	return max(0, h.Seats-use.Taken)
}

// SeatFor is the reservation whose seat a student of courses opening lab
// takes at now: one of the lab, for one of their courses, started (its
// members are let in from its start, not during the lead) and not
// released, with a seat no member has taken (a seat the class's warm
// instance holds is still a member's to claim). Of several, the one that ends
// first. ok is false when there is none: the student is in the general
// line.
func SeatFor(now time.Time, holds []Hold, uses map[int64]Use, courses []string, lab string, rules Rules) (Hold, bool) {
	member := make(map[string]bool, len(courses))
	for _, c := range courses {
		member[c] = true
	}
	var open []Hold
	for _, h := range holds {
		if h.Lab == lab && member[h.Course] && !now.Before(h.Start) && rules.Holding(h, now) && uses[h.ID].Taken < h.Seats {
			open = append(open, h)
		}
	}
	if len(open) == 0 {
		return Hold{}, false
	}
	sort.Slice(open, func(i, j int) bool {
		if !open[i].End.Equal(open[j].End) {
			return open[i].End.Before(open[j].End)
		}
		return open[i].ID < open[j].ID
	})
	return open[0], true
}

// stamp is a moment as messages show it.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
