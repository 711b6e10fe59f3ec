package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/reap"
	"labkeep/shared/seating"
	"labkeep/shared/session"
)

// lineOnly is a waitlist whose Line answers line (all QueueStats reads).
type lineOnly struct {
	seating.Waitlist
	line []seating.Entry
}

func (l lineOnly) Line(context.Context) ([]seating.Entry, error) { return l.line, nil }

// GET /adminStatus is the reaper's status with every lab's line beside
// it: length and the earliest joiner's wait in whole seconds rounded up;
// an empty line reads 0, never absent.
func TestAdminStatusQueues(t *testing.T) {
	cat, err := labs.Parse([]byte(`
labs:
- {name: shell, kind: pod, image: img, nodes: [{role: workspace}]}
- {name: linux-vm, kind: vm, disk: {containerDisk: img}, nodes: [{role: vm}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	secret := []byte("status-test-secret-0123456789abcdef")
	admin, err := access.Sign(secret, "ops", access.RoleAdmin, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	type queue struct {
		Lab               string `json:"lab"`
		Length            int    `json:"length"`
		OldestWaitSeconds int64  `json:"oldestWaitSeconds"`
	}
	tests := []struct {
		name string
		line []seating.Entry
		want []queue
	}{
		{"nobody waits", nil, []queue{{Lab: "linux-vm"}, {Lab: "shell"}}},
		{"two wait for the VM lab", []seating.Entry{
			{Lab: "linux-vm", EnqueuedAt: now.Add(-90*time.Second - time.Millisecond), PolledAt: now},
			{Lab: "linux-vm", EnqueuedAt: now.Add(-time.Second), PolledAt: now},
		}, []queue{{Lab: "linux-vm", Length: 2, OldestWaitSeconds: 91}, {Lab: "shell"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seats := seating.NewUsher(seating.Config{Labs: cat, Waitlist: lineOnly{line: tc.line}, Now: clock,
				Limits: seating.Limits{QueueIdle: seating.DefaultQueueIdle}})
			a := New(Options{Sessions: &session.Service{Labs: cat}, Seats: seats, Auth: access.NewAuthenticator(secret, clock), Now: clock, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			h := a.WithReaper(ReaperOptions{Status: func(context.Context) (reap.Status, error) {
				return reap.Status{LiveSessions: 3, Capacity: reap.Capacity{Used: 2, Limit: 8}}, nil
			}})
			req := httptest.NewRequest("GET", "/adminStatus", nil)
			req.Header.Set("Authorization", "Bearer "+admin)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			var got struct {
				LiveSessions int           `json:"liveSessions"`
				Capacity     reap.Capacity `json:"capacity"`
				Queues       []queue       `json:"queues"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != 200 {
				t.Fatalf("adminStatus = %d %s (%v)", w.Code, w.Body, err)
			}
			if got.LiveSessions != 3 || got.Capacity != (reap.Capacity{Used: 2, Limit: 8}) {
				t.Errorf("the reaper's status is lost: %s", w.Body)
			}
			if diff := cmp.Diff(tc.want, got.Queues); diff != "" {
				t.Errorf("queues (-want +got):\n%s", diff)
			}
		})
	}
}
