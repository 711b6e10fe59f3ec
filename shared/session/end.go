package session

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// EndKind is why a session ended. It decides the row's final status and
// the one sentence a student is shown.
type EndKind string

// The ways a session ends.
const (
	// EndClosed: the student or an administrator closed it.
	EndClosed EndKind = "closed"
	// EndExpired: its time was up (lifetime.Expired).
	EndExpired EndKind = "expired"
	// EndGhost: its VM, VMI or Pod vanished, or it never became ready.
	EndGhost EndKind = "ghost"
	// EndNoCapacity: the open was refused for lack of capacity.
	EndNoCapacity EndKind = "no_capacity"
	// EndProvisioningFailed: the cluster refused to create its objects.
	EndProvisioningFailed EndKind = "provisioning_failed"
)

// Actor is who ended a session.
type Actor string

// The actors that end sessions.
const (
	ActorStudent Actor = "student"
	ActorAdmin   Actor = "admin"
	ActorReaper  Actor = "reaper"
	// ActorOpen is an open ending a session: its own failed provisioning,
	// or the student's expired session reclaimed when they open a new lab.
	ActorOpen Actor = "open"
)

// EndReason is why and by whom a session ended. Kind and Actor are what
// code decides on; Detail is the full story for administrators (it may
// quote the API server) and is never shown to students.
type EndReason struct {
	Kind   EndKind
	Actor  Actor
	Detail string
}

// Status is the final status the reason gives the row.
func (r EndReason) Status() Status {
	switch r.Kind {
	case EndClosed:
		return StatusClosed
	case EndExpired:
		return StatusExpired
	default:
		return StatusFailed
	}
}

// String is the reason as administrators read it.
func (r EndReason) String() string {
	if r.Kind == "" {
		return ""
	}
	s := string(r.Kind) + " by " + string(r.Actor)
	if r.Detail != "" {
		s += ": " + r.Detail
	}
	return s
}

// studentSentences is the one place a student's view of an ending is
// written: the first row whose kind (and actor, where given) matches wins.
// Errors that refuse an open use the same sentences (see ErrorKind).
var studentSentences = []struct {
	kind     EndKind
	actor    Actor
	sentence string
}{
	{EndClosed, ActorAdmin, "the session was closed by an administrator and its resources were deleted"},
	{EndClosed, "", "the session was closed and its resources were deleted"},
	{EndExpired, "", "the session reached its time limit and its resources were deleted"},
	{EndGhost, "", "the lab stopped working or never became ready and was cleaned up; open it again"},
	{EndNoCapacity, "", "no capacity: every lab slot is in use; try again later"},
	{EndProvisioningFailed, "", "the cluster refused to create the lab's resources; nothing was left behind, try again"},
}

// Sentence is the one sentence a student sees for this ending; empty for a
// session that has not ended.
func (r EndReason) Sentence() string {
	if r.Kind == "" {
		return ""
	}
	for _, row := range studentSentences {
		if row.kind == r.Kind && (row.actor == "" || row.actor == r.Actor) {
			return row.sentence
		}
	}
	return studentSentences[len(studentSentences)-1].sentence
}

// Sentence returns the student sentence of an ending of kind k by anyone.
func Sentence(k EndKind) string { return EndReason{Kind: k}.Sentence() }

// ErrorKind maps an error that ends an open to the kind of ending it
// records, so the refusal and the failed row read the same to a student.
// ok is false for errors that end nothing.
func ErrorKind(err error) (k EndKind, ok bool) {
	switch {
	case errors.Is(err, ErrNoCapacity):
		return EndNoCapacity, true
	case errors.Is(err, ErrProvisioning):
		return EndProvisioningFailed, true
	}
	return "", false
}

// An Ending asks End to end one session.
type Ending struct {
	Reason EndReason
	// Due is checked again on the row under its lock; the session ends only
	// if it is still live and due. Nil means always.
	Due func(Session) bool
	// EvenIfTeardownFails marks the row final although some object could
	// not be deleted (a ghost, a failed open): the student must never be
	// locked out of opening again by a leftover, which the reaper then
	// finds as an orphan. Otherwise a failed delete leaves the row live, so
	// the next attempt (the reaper's, the student's) retries everything.
	EvenIfTeardownFails bool
	// Unlocked, if set, runs the deletes with no row lock held: the row is
	// first taken for ending in a short transaction of its own
	// (Taker.Take: re-checked live and due, and changed so that no
	// extension computed before can land), then torn down, and only then
	// re-checked and marked under the row lock, without calling the
	// cluster again. However slow the deletes, no row lock (which extend,
	// close and getSession wait for) and no connection is held across
	// them. Only for endings no open can still be creating objects for
	// (the reaper's expired sessions and running ghosts).
	Unlocked Taker
}

// Taker takes a row for ending in a transaction of its own (the
// reaper's store): see Ending.Unlocked.
type Taker interface {
	// Take re-reads the row under its row lock and, if it is still live
	// and due(row), takes it for ending; ok reports whether it did.
	Take(ctx context.Context, id string, due func(Session) bool) (s Session, ok bool, err error)
}

// ErrTeardown marks an End whose deletes did not all succeed; the row was
// still finished if ended is true.
var ErrTeardown = errors.New("deleting session resources")

// ErrNotOurs marks a delete the Cluster refused because the object is not
// labelled with this environment, or not with the session it was deleted
// for; the object is left as it was. End never marks a row final after a
// refusal, not even with EvenIfTeardownFails: the row may be another
// environment's (a database shared by mistake), whose reaper would then
// take that session's running objects for orphans. The refusal is
// reported on every attempt until someone looks.
var ErrNotOurs = errors.New("refused to delete")

// End is the one way a session ends, used by a close, an open reclaiming an
// expired session or rolling back a failed one, a warm-pool instance
// retired, and the reaper (with Ending.Unlocked where it may). Under the
// row lock it re-reads the row; if it is still live and due, it deletes
// the session's objects (Cluster.Teardown, in the one delete order: what
// runs first, the anchor last) and only then marks the row final with the
// reason at time at. Marking first would leak: a final row is never looked
// at again. Nothing else can extend, mark running or finish the row in
// between.
//
// ended reports whether this call finished the row; the row is returned as
// read or as marked. A teardown error is returned wrapped in ErrTeardown,
// with ended false (row still live) unless e.EvenIfTeardownFails and no
// delete was refused (ErrNotOurs).
func End(ctx context.Context, store RowFinisher, cluster Teardowner, id string, e Ending, at time.Time) (s Session, ended bool, err error) {
	due := e.Due
	if due == nil {
		due = func(Session) bool { return true }
	}
	teardown := func(cur Session) error { return cluster.Teardown(ctx, cur) }
	if e.Unlocked != nil {
		cur, taken, err := e.Unlocked.Take(ctx, id, due)
		if err != nil || !taken {
			return cur, false, err
		}
		done := cluster.Teardown(ctx, cur)
		teardown = func(Session) error { return done }
	}
	var teardownErr error
	act := func(cur Session) (EndReason, error) {
		reason := e.Reason
		teardownErr = teardown(cur)
		if teardownErr != nil && e.EvenIfTeardownFails && !errors.Is(teardownErr, ErrNotOurs) {
			reason.Detail += "; cleanup incomplete, left for the reaper: " + teardownErr.Error()
			return reason, nil
		}
		return reason, teardownErr
	}
	s, ended, err = store.FinishIf(ctx, id, due, act, at)
	if teardownErr != nil {
		return s, ended, fmt.Errorf("%w: %w", ErrTeardown, teardownErr)
	}
	return s, ended, err
}
