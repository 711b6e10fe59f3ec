package reservation

import (
	"sort"
	"time"

	"labkeep/shared/labs"
)

// Slot is one span of a bucket's day: its capacity and the most its
// reservations hold together at any moment of the span, each counted from
// its lead (as Book counts them: what a new booking there could still
// get is Capacity - Reserved).
type Slot struct {
	Start    time.Time
	End      time.Time
	Kind     labs.Kind
	Capacity int
	Reserved int
}

// Free is what the slot leaves to everyone else and to new bookings.
func (s Slot) Free() int { return max(0, s.Capacity-s.Reserved) }

// Timeline splits from to to into spans of step (the last one shorter
// when step does not divide the range) and gives, for each bucket of
// capacities in kind order, a Slot per span. A step of zero or less, or a
// range that does not end after it starts, gives none.
func Timeline(holds []Hold, capacities map[labs.Kind]int, from, to time.Time, step, lead time.Duration) []Slot {
	if step <= 0 || !to.After(from) {
		return nil
	}
	kinds := make([]labs.Kind, 0, len(capacities))
	for k := range capacities {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i] < kinds[j] })
	held := heldFromLead(holds, lead)
	var out []Slot
	for _, k := range kinds {
		for start := from; start.Before(to); start = start.Add(step) {
			end := start.Add(step)
			if end.After(to) {
				end = to
			}
			out = append(out, Slot{Start: start, End: end, Kind: k, Capacity: capacities[k], Reserved: Peak(held, k, start, end)})
		}
	}
	return out
}

// heldFromLead is holds with each window starting lead before its start:
// from then on its seats are held, so that is when it takes capacity.
func heldFromLead(holds []Hold, lead time.Duration) []Hold {
	held := make([]Hold, len(holds))
	for i, h := range holds {
		held[i] = h
		held[i].Start = h.Start.Add(-lead)
	}
	return held
}
