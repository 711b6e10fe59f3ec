package seating

import (
	"labkeep/shared/session"

	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/warmpool"
)

func TestPoolStatuses(t *testing.T) {
	monday := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	sched, err := warmpool.Parse("shell=2; linux-vm=5@Mon-Fri 13:50-16:00", time.UTC, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	row := func(lab string, pool session.PoolState, status session.Status) session.Session {
		return session.Session{Lab: lab, Pool: pool, Status: status}
	}
	tests := []struct {
		name string
		now  time.Time
		live []session.Session
		want []PoolStatus
	}{
		{
			name: "no rows: every scheduled lab with its target and nothing else",
			now:  monday,
			want: []PoolStatus{{Lab: "linux-vm", Target: 5}, {Lab: "shell", Target: 2}},
		},
		{
			name: "idle ready, idle starting and claimed are told apart; other sessions do not count",
			now:  monday,
			live: []session.Session{
				row("shell", session.PoolIdle, session.StatusRunning), row("shell", session.PoolIdle, session.StatusProvisioning),
				row("shell", session.PoolClaimed, session.StatusRunning), row("shell", session.PoolClaimed, session.StatusProvisioning),
				row("shell", "", session.StatusRunning), row("linux-vm", "", session.StatusProvisioning),
			},
			want: []PoolStatus{{Lab: "linux-vm", Target: 5}, {Lab: "shell", Target: 2, Idle: 1, Starting: 1, Claimed: 2}},
		},
		{
			name: "outside the window the target is 0; a lab no longer scheduled still shows its rows",
			now:  monday.Add(3 * time.Hour),
			live: []session.Session{row("linux-vm", session.PoolClaimed, session.StatusRunning), row("old-lab", session.PoolIdle, session.StatusRunning)},
			want: []PoolStatus{{Lab: "linux-vm", Claimed: 1}, {Lab: "old-lab", Idle: 1}, {Lab: "shell", Target: 2}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, PoolStatuses(sched, tc.live, tc.now)); diff != "" {
				t.Errorf("PoolStatuses (-want +got):\n%s", diff)
			}
		})
	}
}
