package session

import (
	"labkeep/shared/line"
	"testing"
)

// A Standing's ID is the id the student knows, whichever side is set.
func TestStandingID(t *testing.T) {
	tests := []struct {
		name string
		st   Standing
		want string
	}{
		{"a session", Standing{Session: &Session{ID: "s-1"}}, "s-1"},
		{"a place in the line", Standing{Waiting: &line.Waiting{ID: "e-1"}}, "e-1"},
		{"neither", Standing{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.st.ID(); got != tc.want {
				t.Errorf("ID() = %q, want %q", got, tc.want)
			}
		})
	}
}
