package session

import "labkeep/shared/line"

// Standing is where a student stands after an open or a poll: in a
// session, or in the line for one. Exactly one of Session and Waiting is
// set when the call succeeded. With an error Waiting is nil, and Session
// is the session the error is about, if any (the live session of
// ErrSessionExists, the final row of an open that failed). The two are
// kept apart so nothing mistakes a place in the line for a session row;
// the HTTP layer renders both into one JSON shape.
type Standing struct {
	Session *Session
	Waiting *line.Waiting
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
