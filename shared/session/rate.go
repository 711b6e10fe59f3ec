package session

import (
	"errors"
	"fmt"
	"time"

	"labkeep/shared/setting"
)

// ErrTooManyOpens refuses an open past the student's open rate
// (OpenRate): nothing is written, and the error (a *TooManyOpensError)
// says when the next open is allowed.
var ErrTooManyOpens = errors.New("too_many_opens")

// TooManyOpensError is ErrTooManyOpens with when the next open would be
// allowed.
type TooManyOpensError struct {
	Rate       OpenRate
	RetryAfter time.Duration
}

func (e *TooManyOpensError) Error() string {
	return fmt.Sprintf("%s: at most %d opens per %s; try again in %s", ErrTooManyOpens, e.Rate.Max, e.Rate.Per, e.RetryAfter.Round(time.Second))
}

func (e *TooManyOpensError) Unwrap() error { return ErrTooManyOpens }

// OpenRate bounds how many opens that write a session row a student may
// make in a sliding window: each open that is refused (no capacity), fails
// or succeeds leaves a row, so without a bound one student in a loop fills
// the table. Opens answered without a new row (the student's live session,
// their place in the line) are not counted. Max 0 means no bound.
type OpenRate struct {
	Max int
	Per time.Duration
}

// Validate reports a rate Allow cannot apply, naming the field.
func (r OpenRate) Validate() error {
	if r.Max == 0 {
		return nil // no bound
	}
	return errors.Join(setting.AtLeast("Max", r.Max, 0), setting.Positive("Per", r.Per))
}

// DefaultOpenRate allows a student 10 opens a minute: far more than a
// student retrying by hand, far fewer than a script.
var DefaultOpenRate = OpenRate{Max: 10, Per: time.Minute}

// Allow decides an open at now from the start times of the student's
// rows in the window (Store.RecentOpens: since now-Per, newest first, at
// most Max): allowed while fewer than Max; otherwise refused until the
// oldest of them leaves the window, in whole seconds rounded up.
func (r OpenRate) Allow(recent []time.Time, now time.Time) error {
	if r.Max <= 0 || len(recent) < r.Max {
		return nil
	}
	oldest := recent[r.Max-1]
	// In whole seconds, rounded up (Retry-After's unit): a client that
	// waits as told is allowed.
	wait := max(oldest.Add(r.Per).Sub(now), time.Nanosecond)
	wait = (wait + time.Second - 1).Truncate(time.Second)
	return &TooManyOpensError{Rate: r, RetryAfter: wait}
}
