package seating

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/session"
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

// poolStore is a PoolStore over memStore's rows, as pgstore stores
// instances: an idle running row is an instance; a claim marks it spent
// (due at abandon) before the cluster step, then deletes the open's row
// and, if claim succeeded, writes the handover over the instance's row.
type poolStore struct{ rows *memStore }

func (p poolStore) ClaimPooled(_ context.Context, lab string, class int64, replaces string, _, abandon time.Time, claim func(Instance) (Handover, error)) (Instance, session.Session, error) {
	p.rows.mu.Lock()
	var inst Instance
	var row session.Session
	for _, r := range p.rows.rows {
		if r.Pool == session.PoolIdle && r.Lab == lab && r.Status == session.StatusRunning && r.Reservation == class {
			row, inst = r, Instance{ID: r.ID, Lab: r.Lab, Kind: r.Kind, Nodes: r.Nodes, Window: r.Window, Ready: true}
		}
	}
	if inst.ID != "" {
		row.Pool = session.PoolSpent
		if abandon.Before(row.ExpiresAt) {
			row.ExpiresAt, row.MaxExpiresAt = abandon, abandon
		}
		p.rows.rows[row.ID] = row
	}
	p.rows.mu.Unlock()
	if inst.ID == "" {
		return inst, session.Session{}, session.ErrNoSession
	}
	h, err := claim(inst)
	if err != nil {
		return inst, session.Session{}, err
	}
	p.rows.mu.Lock()
	defer p.rows.mu.Unlock()
	delete(p.rows.rows, replaces)
	row.Student, row.StudentKey, row.Window, row.ReadyAt = h.Student, h.StudentKey, h.Window, h.ReadyAt
	row.Pool, row.ClaimedFor = session.PoolClaimed, replaces
	p.rows.rows[row.ID] = row
	return inst, row, nil
}

// poolCluster records the claims it is asked for and fails with err.
type poolCluster struct {
	claims []string // "instance key"
	err    error
}

func (c *poolCluster) Claim(_ context.Context, inst Instance, studentKey string, _ labs.Lab) error {
	c.claims = append(c.claims, inst.ID+" "+studentKey)
	return c.err
}

// An open that may take a warm instance gets the ready one handed over
// (the cluster authorizes the student's key on the instance, the row
// becomes theirs with a fresh window); with none ready it provisions
// cold; when the cluster step fails the instance is retired (it may hold
// the student's key) and the open provisions cold.
func TestOpenClaimsAWarmInstance(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	// The key as the open normalizes it (its comment dropped).
	const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBu+gRJ6Ttbo9zL/j2CL1JvXuN/OnM3sdkvp2nF9cwpY"
	type result struct {
		Student, Pool string
		Claimed       bool // the open got the instance's id
		Window        bool // the session's window starts at the open
		ClaimsAsked   []string
		Provisioned   int    // cold provisions
		Instance      string // the instance row's status afterwards
		InstancePool  string // and its pool state
		Retired       bool   // its end says the claim failed
	}
	tests := []struct {
		name     string
		instance bool
		claimErr error
		want     result
	}{
		{"a ready instance is handed over", true, nil,
			result{Student: "ann", Pool: "claimed", Claimed: true, Window: true, ClaimsAsked: []string{"i-1 " + key}, Instance: "running", InstancePool: "claimed"}},
		{"no ready instance: cold", false, nil,
			result{Student: "ann", Window: true, Provisioned: 1}},
		{"the cluster step fails: retired, cold", true, errors.New("exec refused"),
			result{Student: "ann", Window: true, ClaimsAsked: []string{"i-1 " + key}, Provisioned: 1, Instance: "closed", InstancePool: "spent", Retired: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			store := newStore()
			c := &fakeCluster{}
			if tc.instance {
				store.rows["i-1"] = session.Session{ID: "i-1", Student: PoolStudent, Lab: "one", Kind: labs.KindVM, Status: session.StatusRunning,
					Window: lifetime.Window{StartedAt: t0.Add(-time.Hour), ExpiresAt: t0, MaxExpiresAt: t0},
					Pool:   session.PoolIdle, Nodes: []session.Node{{Name: "vm", Role: "vm", Ready: true}}}
			}
			pc := &poolCluster{err: tc.claimErr}
			svc := newService(t, c, &now, store, func(cfg *Config) {
				cfg.Pool = &WarmPool{Schedule: warmpool.Schedule{Rules: []warmpool.Rule{{Lab: "one", Size: 1}}}, TTL: time.Hour, Store: poolStore{store}, Cluster: pc}
			})
			opened, err := svc.Open(context.Background(), "ann", "one", key+" ann")
			if err != nil || opened.Session == nil {
				t.Fatalf("Open = %+v, %v; want a session", opened.Waiting, err)
			}
			s := opened.Session
			inst := store.rows["i-1"]
			got := result{Student: s.Student, Pool: string(s.Pool), Claimed: s.ID == "i-1", Window: s.StartedAt.Equal(t0),
				ClaimsAsked: pc.claims, Provisioned: len(c.provisioned), Instance: string(inst.Status), InstancePool: string(inst.Pool),
				Retired: strings.Contains(inst.End.Detail, "claim failed: exec refused")}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("open with a warm pool (-want +got):\n%s", diff)
			}
		})
	}
}
