// Package termlimit bounds the web terminal (shared/terminal): how many
// terminals a student and a server process hold at once, how long a new
// socket may take to authenticate, and how long a terminal stays open
// without input or at all. It only decides; the terminal counts its
// sockets here and closes them.
//
// Why: every terminal holds a WebSocket here and an exec (or console)
// stream through the API server to the kubelet, for as long as it is
// open. Without bounds one student with a day-long token could open
// thousands of them, a flood of sockets that never send a token could
// exhaust the process, and a forgotten browser tab would hold its stream
// for ever. The bounds are per process because the terminal's sockets are:
// each replica of the on-prem server counts its own.
package termlimit

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"labkeep/shared/setting"
)

// ErrTooMany refuses a terminal past a cap: the student's own (close one
// of theirs first) or the process's (try again shortly). Its text is the
// error code the API answers with (429 too_many_terminals).
var ErrTooMany = errors.New("too_many_terminals")

// Limits are the terminal's bounds.
type Limits struct {
	// PerStudent is how many terminals one student holds open at once.
	PerStudent int
	// PerProcess is how many sockets the process holds at once: open
	// terminals and sockets still authenticating together, so sockets
	// that never send a token cannot take more than this.
	PerProcess int
	// AuthTimeout is how long a new socket may take to send its token.
	AuthTimeout time.Duration
	// Idle closes a terminal whose client has sent no input for this
	// long. Output does not count: a program that prints for ever in a
	// forgotten tab must not keep its stream open.
	Idle time.Duration
	// MaxLifetime closes a terminal open this long, typing or not.
	MaxLifetime time.Duration
	// Recheck is how often an open terminal re-reads its session, so it
	// closes within about this long of the session ending.
	Recheck time.Duration
}

// Defaults of Limits: a few terminals per student (a shell or two and a
// log to watch), enough per process for a class, a token sent within
// seconds (the page sends it as soon as the socket opens), a quarter of
// an hour idle, and longer than the longest session (3 h by default).
const (
	DefaultPerStudent  = 3
	DefaultPerProcess  = 200
	DefaultAuthTimeout = 3 * time.Second
	DefaultIdle        = 15 * time.Minute
	DefaultMaxLifetime = 4 * time.Hour
	DefaultRecheck     = 5 * time.Second
)

// DefaultLimits are the Default* values.
func DefaultLimits() Limits {
	return Limits{PerStudent: DefaultPerStudent, PerProcess: DefaultPerProcess, AuthTimeout: DefaultAuthTimeout,
		Idle: DefaultIdle, MaxLifetime: DefaultMaxLifetime, Recheck: DefaultRecheck}
}

// Validate checks the limits; errors name the field (setting.Error).
func (l Limits) Validate() error {
	return errors.Join(setting.AtLeast("PerStudent", l.PerStudent, 1), setting.AtLeast("PerProcess", l.PerProcess, 1),
		setting.Positive("AuthTimeout", l.AuthTimeout), setting.Positive("Idle", l.Idle),
		setting.Positive("MaxLifetime", l.MaxLifetime), setting.Positive("Recheck", l.Recheck))
}

// Ledger counts one process's terminal sockets against Limits. It is safe
// for concurrent use.
type Ledger struct {
	limits Limits

	mu sync.Mutex
	// pending counts sockets not yet authenticated; open the terminals of
	// each student, and total their sum.
	pending, total int
	open           map[string]int
}

// NewLedger returns an empty Ledger for limits.
func NewLedger(limits Limits) *Ledger {
	return &Ledger{limits: limits, open: map[string]int{}}
}

// Place is one socket's place in a Ledger: pending from Arrive until
// Admit names its student, open after, given back by Leave.
type Place struct {
	ledger  *Ledger
	student string
	state   placeState
}

type placeState int

const (
	pending placeState = iota
	admitted
	left
)

// Arrive takes a place for a new socket, before anything is known of its
// caller, or refuses with ErrTooMany when the process holds PerProcess
// sockets already. The caller must Leave the place when the socket ends.
func (l *Ledger) Arrive() (*Place, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending+l.total >= l.limits.PerProcess {
		return nil, fmt.Errorf("%w: this server holds %d terminals, its most; try again shortly", ErrTooMany, l.limits.PerProcess)
	}
	l.pending++
	return &Place{ledger: l}, nil
}

// Admit makes a pending place student's open terminal, or refuses with
// ErrTooMany when student holds PerStudent terminals already (the place
// stays pending until Leave). Admitting a place twice is an error.
func (p *Place) Admit(student string) error {
	l := p.ledger
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.state != pending {
		return errors.New("terminal place already admitted or left")
	}
	if n := l.open[student]; n >= l.limits.PerStudent {
		return fmt.Errorf("%w: you have %d terminals open, the most a student may; close one first", ErrTooMany, n)
	}
	l.pending--
	l.open[student]++
	l.total++
	p.student, p.state = student, admitted
	return nil
}

// Leave gives the place back; leaving twice is leaving once.
func (p *Place) Leave() {
	l := p.ledger
	l.mu.Lock()
	defer l.mu.Unlock()
	switch p.state {
	case pending:
		l.pending--
	case admitted:
		l.total--
		if l.open[p.student]--; l.open[p.student] == 0 {
			delete(l.open, p.student)
		}
	}
	p.state = left
}

// Counts is what a Ledger holds at one moment.
type Counts struct {
	// Pending are sockets not yet authenticated; Open the open terminals.
	Pending, Open int
	// ByStudent are the open terminals of each student holding any.
	ByStudent map[string]int
}

// Counts returns what l holds now.
func (l *Ledger) Counts() Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := Counts{Pending: l.pending, Open: l.total, ByStudent: make(map[string]int, len(l.open))}
	for s, n := range l.open {
		c.ByStudent[s] = n
	}
	return c
}

// Timeout is which time bound closes a terminal, if any.
type Timeout int

const (
	// NoTimeout: the terminal stays open.
	NoTimeout Timeout = iota
	// TimeoutIdle: no input for Limits.Idle.
	TimeoutIdle
	// TimeoutLifetime: open for Limits.MaxLifetime.
	TimeoutLifetime
)

// Reason is the close reason a student reads for timeout under l: it
// starts with "idle" or "lifetime", then says which bound passed.
func (l Limits) Reason(timeout Timeout) string {
	switch timeout {
	case TimeoutIdle:
		return fmt.Sprintf("idle: no input for %s; reconnect for a new shell", setting.ShowDuration(l.Idle))
	case TimeoutLifetime:
		return fmt.Sprintf("lifetime: open for %s, the longest a terminal stays open; reconnect for a new shell", setting.ShowDuration(l.MaxLifetime))
	}
	return ""
}

// Times are an open terminal's moments, by the terminal's clock.
type Times struct {
	// Opened is when it was admitted; Input when its client last sent
	// input (Opened until it does); Checked when its session was last
	// read.
	Opened, Input, Checked time.Time
}

// Verdict is what to do with an open terminal at one moment.
type Verdict struct {
	// Timeout, if not NoTimeout, closes the terminal.
	Timeout Timeout
	// Recheck re-reads the session now: its interval has passed, or the
	// terminal is closing on time and its session, if it has ended, is
	// the better reason to give.
	Recheck bool
	// Wake is when to decide again if the terminal stays open (after a
	// recheck, Recheck from now); zero when Timeout closes it.
	Wake time.Time
}

// Decide is the Verdict on a terminal with times t at now. The lifetime
// bound is named before the idle one when both have passed.
func (l Limits) Decide(t Times, now time.Time) Verdict {
	idleAt, endAt, recheckAt := t.Input.Add(l.Idle), t.Opened.Add(l.MaxLifetime), t.Checked.Add(l.Recheck)
	var v Verdict
	switch {
	case !now.Before(endAt):
		v.Timeout = TimeoutLifetime
	case !now.Before(idleAt):
		v.Timeout = TimeoutIdle
	}
	v.Recheck = v.Timeout != NoTimeout || !now.Before(recheckAt)
	if v.Timeout != NoTimeout {
		return v
	}
	if v.Recheck {
		recheckAt = now.Add(l.Recheck)
	}
	v.Wake = recheckAt
	for _, at := range []time.Time{idleAt, endAt} {
		if at.Before(v.Wake) {
			v.Wake = at
		}
	}
	return v
}
