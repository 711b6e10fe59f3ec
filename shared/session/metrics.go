package session

import (
	"context"
	"errors"
	"time"
)

// Metrics counts what the Starter and the Service do; the entry points
// implement it (Prometheus), so session depends on no metrics library.
//
// Endings counted here are the Service's: closes by a student or an
// administrator and failed opens rolled back. The reaper counts its own
// endings (expired, ghost, orphan) through reap.Metrics.
type Metrics interface {
	// Opened counts one Open or OpenWaiting of lab by its outcome; lab is
	// empty when the catalog has no such lab, so a count is never keyed
	// by a name a caller chose.
	Opened(lab string, outcome Outcome)
	// Ready records a student's time to ready for lab, when the session
	// turns running (or is claimed from the warm pool). An unclaimed
	// warm-pool instance has no student waiting for it and is not
	// reported.
	Ready(lab string, timeToReady time.Duration)
	// Extended counts one Extend by its outcome.
	Extended(outcome Outcome)
	// Ended counts one session the Service ended (a close, a failed open
	// rolled back), by its kind and actor.
	Ended(kind EndKind, actor Actor)
}

// Outcome is how a call went: OutcomeOK, the code of the sentinel error
// it returned (the API's error code: unknown_lab, no_capacity, …) or
// OutcomeError for anything else (a bad key, a database fault).
type Outcome string

// The outcomes that are no sentinel's code.
const (
	OutcomeOK    Outcome = "ok"
	OutcomeError Outcome = "error"
)

// outcomes are the sentinel errors an open or extend is counted by.
var outcomes = []error{ErrUnknownLab, ErrSessionExists, ErrNoCapacity, ErrProvisioning, ErrExtensionCap, ErrNotRunning, ErrNoSession}

// OutcomeOf is err's Outcome.
func OutcomeOf(err error) Outcome {
	if err == nil {
		return OutcomeOK
	}
	for _, r := range outcomes {
		if errors.Is(err, r) {
			return Outcome(r.Error())
		}
	}
	return OutcomeError
}

type noMetrics struct{}

func (noMetrics) Opened(string, Outcome)      {}
func (noMetrics) Ready(string, time.Duration) {}
func (noMetrics) Extended(Outcome)            {}
func (noMetrics) Ended(EndKind, Actor)        {}

// metrics is s.Metrics, or one that counts nothing when it is nil.
func (s *Starter) metrics() Metrics {
	if s.Metrics == nil {
		return noMetrics{}
	}
	return s.Metrics
}

func (s *Starter) opened(lab string, err error) {
	if errors.Is(err, ErrUnknownLab) {
		lab = "" // never a name a caller chose
	}
	s.metrics().Opened(lab, OutcomeOf(err))
}

// ready reports a student's time to ready; an unclaimed pool instance has
// no student waiting for it.
func (s *Starter) ready(sess Session) {
	if sess.ReadyAt.IsZero() || sess.Pool.Unclaimed() {
		return
	}
	s.metrics().Ready(sess.Lab, sess.TimeToReady())
}

func (s *Starter) extended(err error) { s.metrics().Extended(OutcomeOf(err)) }

func (s *Starter) ended(r EndReason) { s.metrics().Ended(r.Kind, r.Actor) }

// LiveCount is how many students' live sessions of a lab are in a status
// (provisioning or running).
type LiveCount struct {
	Lab    string
	Status Status
	N      int
}

// CountLive counts the students' live sessions by lab and status, read
// from the Store, so the count is the database's truth whichever instance
// opened the sessions. Unclaimed warm-pool instances are nobody's session
// yet and are not counted (seating reports the warm pool).
func (s *Starter) CountLive(ctx context.Context) ([]LiveCount, error) {
	live, err := s.Store.ListLive(ctx)
	if err != nil {
		return nil, err
	}
	type key struct {
		lab    string
		status Status
	}
	index := map[key]int{}
	var out []LiveCount
	for _, sess := range live {
		if sess.Pool.Unclaimed() {
			continue
		}
		k := key{sess.Lab, sess.Status}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, LiveCount{Lab: sess.Lab, Status: sess.Status})
		}
		out[i].N++
	}
	return out, nil
}
