package seating

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/reservation"
	"labkeep/shared/session"
	"labkeep/shared/warmpool"
)

// bookedRows is the reservations port over a memStore: the holds as
// given, and each one's use counted from the store's live rows as pgstore
// counts them (an unclaimed instance's row pooled, any other taken).
type bookedRows struct {
	store *memStore
	holds []reservation.Hold
}

func (b bookedRows) Holding(ctx context.Context, _, _ time.Time) ([]reservation.Hold, map[int64]reservation.Use, error) {
	live, err := b.store.ListLive(ctx)
	uses := map[int64]reservation.Use{}
	for _, l := range live {
		if l.Reservation == 0 {
			continue
		}
		u := uses[l.Reservation]
		if l.Pool == session.PoolIdle {
			u.Pooled++
		} else {
			u.Taken++
		}
		uses[l.Reservation] = u
	}
	return b.holds, uses, err
}

func (b bookedRows) TakeSeat(context.Context, string, int64) error { return nil }

// The classes' warm instances each reaper run, with no schedule written:
// from a reservation's lead, one instance for each seat no member took,
// held for its class until the seats are released; over that, or once
// released, they are ended; never more than the capacity beside what runs
// leaves, and none for a lab that keeps a home.
func TestClassWarmInstances(t *testing.T) {
	cat, err := labs.Parse([]byte(`labs:
- {name: shell, kind: pod, image: img, nodes: [{role: workspace}]}
- {name: notes, kind: pod, image: img, nodes: [{role: workspace}], home: {size: 1Gi, mountPath: /root}}
`))
	if err != nil {
		t.Fatal(err)
	}
	rules := reservation.DefaultRules() // lead 10 min, release 15 min after the start
	start := time.Date(2026, 12, 7, 14, 0, 0, 0, time.UTC)
	class := func(lab string) reservation.Hold {
		return reservation.Hold{Reservation: reservation.Reservation{ID: 7, Course: "cs-101", Lab: lab, Seats: 2, Start: start, End: start.Add(time.Hour)},
			Kind: labs.KindPod, PerSeat: 1}
	}
	type outcome struct {
		Created int
		Deleted map[string]int
		// Instances are the class's unclaimed instances after the run.
		Instances int
	}
	tests := []struct {
		name string
		at   time.Duration // from the start
		lab  string
		// idle class instances and members' sessions before the run, and
		// workspace Pods of anyone else.
		idle, taken, others int
		want                outcome
	}{
		{"before the lead: none", -rules.Lead - time.Second, "shell", 0, 0, 0, outcome{}},
		{"from the lead: one a seat", -rules.Lead, "shell", 0, 0, 0, outcome{Created: 2, Instances: 2}},
		{"a member took a seat: one for the other", 0, "shell", 0, 1, 0, outcome{Created: 1, Instances: 1}},
		{"the seats' instances stand: nothing to do", 0, "shell", 2, 0, 0, outcome{Instances: 2}},
		{"a member opened before they were ready: the spare is ended", 0, "shell", 2, 1, 0,
			outcome{Deleted: map[string]int{warmpool.ReasonOverTarget: 1}, Instances: 1}},
		{"released: every unclaimed one is ended", rules.Release, "shell", 2, 0, 0,
			outcome{Deleted: map[string]int{ReasonClassReleased: 2}}},
		{"room for one beside what runs: one", 0, "shell", 0, 0, 3, outcome{Created: 1, Instances: 1}},
		{"a lab that keeps a home: none", 0, "notes", 0, 0, 0, outcome{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := start.Add(tc.at)
			clock := func() time.Time { return now }
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			store := newStore()
			c := &fakeCluster{pods: tc.idle + tc.taken + tc.others}
			h := class(tc.lab)
			for i := range tc.idle + tc.taken {
				row := session.Session{ID: fmt.Sprintf("row-%d", i), Student: PoolStudent, Lab: tc.lab, Kind: labs.KindPod, Status: session.StatusRunning,
					Pool: session.PoolIdle, Reservation: h.ID, Window: lifetime.Window{StartedAt: now.Add(-time.Minute), ExpiresAt: rules.HeldUntil(h), MaxExpiresAt: rules.HeldUntil(h)}}
				if i >= tc.idle {
					row.Student, row.Pool = fmt.Sprintf("member-%d", i), ""
				}
				if err := store.Create(context.Background(), row); err != nil {
					t.Fatal(err)
				}
			}
			rows := &session.Starter{Store: store, Cluster: c, CleanupTimeout: time.Second,
				Policy: lifetime.Policy{Lifetime: time.Hour, MaxLifetime: 3 * time.Hour}, Now: clock, Log: log}
			u := NewUsher(Config{Rows: rows, Store: store, Cluster: c, Labs: cat, Now: clock, Log: log,
				Limits:       Limits{MaxVMs: 4, MaxPods: 4, CapacityWait: time.Minute, CleanupTimeout: time.Second},
				Pool:         &WarmPool{TTL: DefaultPoolTTL},
				Reservations: bookedRows{store: store, holds: []reservation.Hold{h}}, ReservationRules: rules})

			rep, err := u.MaintainPools(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			got := outcome{Created: rep.Created}
			if len(rep.Deleted) > 0 {
				got.Deleted = rep.Deleted
			}
			live, _ := store.ListLive(context.Background())
			for _, l := range live {
				if l.Pool != session.PoolIdle {
					continue
				}
				got.Instances++
				if l.Reservation != h.ID || !l.ExpiresAt.Equal(rules.HeldUntil(h)) || l.Student != PoolStudent {
					t.Errorf("instance %s: reservation %d, expires %s, student %q; want the class's, until its release at %s", l.ID, l.Reservation, l.ExpiresAt, l.Student, rules.HeldUntil(h))
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
