// Package rate is the one sliding-window rule labkeep bounds a caller's
// writes with: a student's opens that write a session row, a workspace's
// alerts. The store counts the caller's recent events (it already keeps
// them: session rows, alert rows), so the bound holds across every
// instance of the functions without state of its own; Allow decides from
// those times alone.
package rate

import (
	"errors"
	"fmt"
	"time"

	"labkeep/shared/setting"
)

// Limit allows at most Max events in any window of length Per. Max 0
// means no bound.
type Limit struct {
	Max int
	Per time.Duration
}

// Validate reports a limit Allow cannot apply, naming the field.
func (l Limit) Validate() error {
	if l.Max == 0 {
		return nil // no bound
	}
	return errors.Join(setting.AtLeast("Max", l.Max, 0), setting.Positive("Per", l.Per))
}

// Since is where the window that decides an event at now starts: the
// store reads the events after it, newest first, at most Max of them.
func (l Limit) Since(now time.Time) time.Time { return now.Add(-l.Per) }

// Exceeded is an event Allow refused: RetryAfter is when the next is
// allowed, in whole seconds rounded up (Retry-After's unit), so a caller
// that waits as told is allowed.
type Exceeded struct {
	Limit      Limit
	RetryAfter time.Duration
}

func (e *Exceeded) Error() string {
	return fmt.Sprintf("at most %d per %s; try again in %s", e.Limit.Max, e.Limit.Per, e.RetryAfter)
}

// Allow decides an event at now from the times of the caller's events in
// the window (since Since(now), newest first, at most Max): allowed while
// fewer than Max; otherwise refused with an *Exceeded until the oldest of
// them leaves the window.
func (l Limit) Allow(recent []time.Time, now time.Time) error {
	if l.Max <= 0 || len(recent) < l.Max {
		return nil
	}
	oldest := recent[l.Max-1]
	wait := max(oldest.Add(l.Per).Sub(now), time.Nanosecond)
	wait = (wait + time.Second - 1).Truncate(time.Second)
	return &Exceeded{Limit: l, RetryAfter: wait}
}
