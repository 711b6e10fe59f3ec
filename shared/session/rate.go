package session

import (
	"errors"
	"time"

	"labkeep/shared/rate"
)

// ErrTooManyOpens refuses an open past the student's open rate
// (OpenRate): nothing is written, and the error wraps a *rate.Exceeded
// saying when the next open is allowed.
var ErrTooManyOpens = errors.New("too_many_opens")

// OpenRate bounds how many opens that write a session row a student may
// make in a sliding window: each open that is refused (no capacity), fails
// or succeeds leaves a row, so without a bound one student in a loop fills
// the table. Opens answered without a new row (the student's live session,
// their place in the line) are not counted. Max 0 means no bound.
type OpenRate = rate.Limit

// DefaultOpenRate allows a student 10 opens a minute: far more than a
// student retrying by hand, far fewer than a script.
var DefaultOpenRate = OpenRate{Max: 10, Per: time.Minute}
