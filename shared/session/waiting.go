package session

import (
	"time"

	"labkeep/shared/labs"
)

// Waiting is a student's place in the line for capacity (package seating
// keeps the line): the view of a waitlist entry. It is not a Session: it
// has no row, no status, no lifetime and no nodes until it is served, when
// it becomes a provisioning session with the same ID.
type Waiting struct {
	// ID is the id the session gets when the entry is served, so the
	// student keeps one id from the open to the session.
	ID      string
	Student string
	Lab     string
	Kind    labs.Kind
	// StudentKey is the public key the student will log in with (theirs,
	// or the one generated when they joined).
	StudentKey string
	// JoinedAt is when the student joined the line.
	JoinedAt time.Time
	Place    Place
	// Issued is the generated key pair's private half, only in the answer
	// to the open that joined the line; empty on every later read.
	Issued Issued
}

// Place is where a waiting student stands in the line of their lab's
// capacity bucket.
type Place struct {
	// Position is 1 for the head of the line.
	Position int
	// ETA is the likely wait until the session starts provisioning;
	// ETALatest the longest it can take.
	ETA, ETALatest time.Duration
}

// Standing is where a student stands after an open or a poll: in a
// session, or in the line for one. Exactly one of Session and Waiting is
// set when the call succeeded. With an error Waiting is nil, and Session
// is the session the error is about, if any (the live session of
// ErrSessionExists, the final row of an open that failed). The two are
// kept apart so nothing mistakes a place in the line for a session row;
// the HTTP layer renders both into one JSON shape.
type Standing struct {
	Session *Session
	Waiting *Waiting
}

// ID is the id the student knows: their session's or their entry's (the
// same id once the entry is served); empty when neither is set.
func (st Standing) ID() string {
	switch {
	case st.Session != nil:
		return st.Session.ID
	case st.Waiting != nil:
		return st.Waiting.ID
	}
	return ""
}
