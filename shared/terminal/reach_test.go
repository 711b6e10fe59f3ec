package terminal

import (
	"context"
	"errors"
	"labkeep/shared/line"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/access"
	"labkeep/shared/lifetime"
	"labkeep/shared/session"
)

// standings is a Sessions that answers each id with a fixed Standing
// (session.ErrNoSession for any other id).
type standings map[string]session.Standing

func (s standings) Get(_ context.Context, _, id string) (session.Standing, error) {
	st, ok := s[id]
	if !ok {
		return session.Standing{}, session.ErrNoSession
	}
	return st, nil
}

// A terminal reaches only a node of the caller's own running session:
// a place in the line, a provisioning session, an ended one, another
// student's and a missing node are each refused, saying which.
func TestReach(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	window := lifetime.Window{StartedAt: now.Add(-time.Minute), ExpiresAt: now.Add(time.Hour), MaxExpiresAt: now.Add(3 * time.Hour)}
	nodes := []session.Node{{Name: "cp", Role: "control-plane"}, {Name: "w1", Role: "worker"}}
	with := func(status session.Status) session.Standing {
		return session.Standing{Session: &session.Session{ID: "s-1", Status: status, Window: window, Nodes: nodes}}
	}
	tests := []struct {
		name       string
		standing   session.Standing
		id, node   string
		wantErr    error
		wantObject string
	}{
		{"running: the first node", with(session.StatusRunning), "s-1", "", nil, session.NodeName("s-1", "cp")},
		{"running: the named node", with(session.StatusRunning), "s-1", "w1", nil, session.NodeName("s-1", "w1")},
		{"running: no such node", with(session.StatusRunning), "s-1", "w9", access.ErrBadRequest, ""},
		{"waiting in line", session.Standing{Waiting: &line.Waiting{ID: "s-1", Place: line.Place{Position: 1}}}, "s-1", "", session.ErrNotRunning, ""},
		{"provisioning", with(session.StatusProvisioning), "s-1", "", session.ErrNotRunning, ""},
		{"ended", with(session.StatusClosed), "s-1", "", access.ErrForbidden, ""},
		{"not the caller's", with(session.StatusRunning), "s-2", "", access.ErrForbidden, ""},
		{"no id", with(session.StatusRunning), "", "", access.ErrBadRequest, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Reach(context.Background(), standings{"s-1": tc.standing}, now, "ann", tc.id, tc.node)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr != nil) != (err != nil) {
				t.Fatalf("Reach = %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.wantObject, got.Object); diff != "" {
				t.Errorf("object (-want +got):\n%s", diff)
			}
		})
	}
}
