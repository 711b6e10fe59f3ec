// Package line describes a student's place in the line for capacity: the
// view the waitlist (package seating) gives of an entry, and what the
// session API returns while a student waits. It holds no rule and imports
// only the lab kinds, so the life of a session (package session) can hand a
// place back without knowing how the line is kept.
package line

import (
	"time"

	"labkeep/shared/labs"
)

// Waiting is a student's place in the line. It is not a session: it has no
// row, no status, no lifetime and no nodes until it is served, when it
// becomes a provisioning session with the same ID.
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
	// StudentPrivateKey is the private half of the key pair generated
	// because the student sent none, only in the answer to the open that
	// joined the line; empty on every later read.
	StudentPrivateKey string
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
