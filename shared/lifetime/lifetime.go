// Package lifetime is the single source of truth for how long a lab session
// lives. The student's countdown (remainingSeconds in every API response) and
// the reaper's expiry decision both call Remaining, so the two can never
// disagree about when a session ends. It does no I/O and takes the current
// time as an argument, so callers inject their clock.
package lifetime

import (
	"errors"
	"time"

	"labkeep/shared/setting"
)

// Policy holds the configured durations. The zero value is invalid; check
// with Validate before use.
type Policy struct {
	// Lifetime is how long a session lives after it opens, and how far an
	// extension pushes the expiry from the moment of the extension.
	Lifetime time.Duration
	// MaxLifetime caps the expiry, counted from the session start, however
	// often the session is extended.
	MaxLifetime time.Duration
}

// DefaultPolicy is an hour per session, extendable up to three hours
// from the start.
func DefaultPolicy() Policy {
	return Policy{Lifetime: 60 * time.Minute, MaxLifetime: 180 * time.Minute}
}

// Validate reports a policy that could never produce a sensible session:
// a non-positive lifetime or a cap below the initial lifetime.
func (p Policy) Validate() error {
	if p.Lifetime <= 0 {
		return setting.Invalid("Lifetime", "must be positive, got %s", p.Lifetime)
	}
	if p.MaxLifetime < p.Lifetime {
		return setting.Invalid("MaxLifetime", "%s must not be shorter than the lifetime %s", p.MaxLifetime, p.Lifetime)
	}
	return nil
}

// Window is the expiry state of one session.
type Window struct {
	StartedAt    time.Time
	ExpiresAt    time.Time
	MaxExpiresAt time.Time
}

// Open returns the window of a session that starts at startedAt:
// expiresAt = startedAt + Lifetime, maxExpiresAt = startedAt + MaxLifetime.
func (p Policy) Open(startedAt time.Time) Window {
	return Window{
		StartedAt:    startedAt,
		ExpiresAt:    startedAt.Add(p.Lifetime),
		MaxExpiresAt: startedAt.Add(p.MaxLifetime),
	}
}

// ErrAtCap means the session already expires at its maximum lifetime, so an
// extension cannot add anything.
var ErrAtCap = errors.New("session already runs until its maximum lifetime")

// ErrExpired means the session's expiry has passed; an expired session is
// the reaper's and can no longer be extended.
var ErrExpired = errors.New("session has expired")

// Extend returns the window after an extension at now:
// expiresAt = min(now + Lifetime, maxExpiresAt), and never earlier than the
// current expiresAt (an extension never shortens a session, even if the
// configured lifetime was lowered since it opened). Returns ErrExpired if
// the session has already expired at now, and ErrAtCap if the expiry already
// equals the cap.
func (p Policy) Extend(w Window, now time.Time) (Window, error) {
	if err := ExtendRefusal(w, now); err != nil {
		return w, err
	}
	next := now.Add(p.Lifetime)
	if next.After(w.MaxExpiresAt) {
		next = w.MaxExpiresAt
	}
	if next.After(w.ExpiresAt) {
		w.ExpiresAt = next
	}
	return w, nil
}

// Remaining is the time left before the session expires at now; zero once
// it has expired (never negative). This is the one function deciding expiry:
// the countdown shows it and the reaper reaps when it is zero.
func Remaining(w Window, now time.Time) time.Duration {
	left := w.ExpiresAt.Sub(now)
	if left < 0 {
		return 0
	}
	return left
}

// Expired reports whether the session's time is up at now, i.e. Remaining
// is zero.
func Expired(w Window, now time.Time) bool {
	return Remaining(w, now) == 0
}

// Extendable reports whether Extend at now would succeed for a running
// session: not expired and not yet at the cap.
func Extendable(w Window, now time.Time) bool {
	return ExtendRefusal(w, now) == nil
}

// ExtendRefusal is why Extend at now would fail for a running session
// (ErrExpired, ErrAtCap), or nil if it would succeed.
func ExtendRefusal(w Window, now time.Time) error {
	switch {
	case Expired(w, now):
		return ErrExpired
	case !w.ExpiresAt.Before(w.MaxExpiresAt):
		return ErrAtCap
	}
	return nil
}

// WarnBefore are how long before its expiry a student is warned that a
// session is ending, the earliest warning first.
var WarnBefore = []time.Duration{10 * time.Minute, 5 * time.Minute}

// Warning is one warning of a window: at At, Before is left.
type Warning struct {
	Before time.Duration
	At     time.Time
}

// Due reports whether the warning's time has come at now while the window
// has not yet expired.
func (wn Warning) Due(w Window, now time.Time) bool {
	return !now.Before(wn.At) && !Expired(w, now)
}

// Warnings are w's warnings, one per WarnBefore, at ExpiresAt − Before
// (they move with an extension). A warning that would come before the
// session started is left out: a lifetime shorter than it never gets it.
func Warnings(w Window) []Warning {
	var out []Warning
	for _, b := range WarnBefore {
		at := w.ExpiresAt.Add(-b)
		if at.Before(w.StartedAt) {
			continue
		}
		out = append(out, Warning{Before: b, At: at})
	}
	return out
}
