package seating

import (
	"context"
	"sort"
	"time"
)

// QueueStat is one lab's line as an administrator sees it: how many
// students wait for it and how long the first of them has waited.
type QueueStat struct {
	Lab    string
	Length int
	// OldestWait is how long the earliest of them has waited (since
	// joining, not since their last poll); zero when nobody waits.
	OldestWait time.Duration
}

// QueueStatsOf counts line (any order) per lab at now: one QueueStat for
// every lab of labs (Length 0 if nobody waits for it) and for every other
// lab someone waits for (one that left the catalog), sorted by lab. An
// entry nobody polled since now−idle is not counted: it has lost its
// place, and the next look at the line drops it (the same rule as
// Waitlist.DropIdle).
func QueueStatsOf(labs []string, line []Entry, now time.Time, idle time.Duration) []QueueStat {
	by := map[string]*QueueStat{}
	for _, l := range labs {
		by[l] = &QueueStat{Lab: l}
	}
	before := now.Add(-idle)
	for _, e := range line {
		if e.PolledAt.Before(before) {
			continue
		}
		q := by[e.Lab]
		if q == nil {
			q = &QueueStat{Lab: e.Lab}
			by[e.Lab] = q
		}
		q.Length++
		if w := now.Sub(e.EnqueuedAt); w > q.OldestWait {
			q.OldestWait = w
		}
	}
	out := make([]QueueStat, 0, len(by))
	for _, q := range by {
		out = append(out, *q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Lab < out[j].Lab })
	return out
}

// QueueStats reads the line and counts it per lab of the catalog
// (QueueStatsOf); it changes nothing. Without a Waitlist every lab has
// an empty line.
func (u *Usher) QueueStats(ctx context.Context) ([]QueueStat, error) {
	var line []Entry
	if u.waitlist != nil {
		var err error
		if line, err = u.waitlist.Line(ctx); err != nil {
			return nil, err
		}
	}
	return QueueStatsOf(u.labs.Names(), line, u.now(), u.limits.QueueIdle), nil
}
