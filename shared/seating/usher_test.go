package seating

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/session"
)

// memStore is an in-memory Store for testing the Usher's decisions; the
// real store's guarantees are tested against PostgreSQL in pgstore.
type memStore struct {
	mu   sync.Mutex
	rows map[string]session.Session
	// onLock runs when LockCapacity is called (before it returns); a
	// blocked lock waits for ctx instead of returning.
	onLock  func()
	blocked bool
}

func newStore() *memStore { return &memStore{rows: map[string]session.Session{}} }

func (m *memStore) Create(_ context.Context, s session.Session) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rows {
		// Unclaimed warm instances share one student, as in the real store.
		if r.Student == s.Student && r.Status.Live() && !s.Pool.Unclaimed() {
			return session.ErrSessionExists
		}
	}
	s.Issued = session.Issued{}
	m.rows[s.ID] = s
	return nil
}

func (m *memStore) Get(_ context.Context, id string) (session.Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.rows[id]
	if !ok {
		return s, session.ErrNoSession
	}
	return s, nil
}

func (m *memStore) LiveFor(_ context.Context, student string) (session.Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rows {
		if r.Student == student && r.Status.Live() {
			return r, nil
		}
	}
	return session.Session{}, session.ErrNoSession
}

func (m *memStore) Latest(ctx context.Context, student string) (session.Session, error) {
	return m.LiveFor(ctx, student)
}

func (m *memStore) ListLive(context.Context) ([]session.Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []session.Session
	for _, r := range m.rows {
		if r.Status.Live() {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b session.Session) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

func (m *memStore) MarkRunning(_ context.Context, id string, at time.Time, nodes []session.Node) (session.Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.rows[id]
	if s.Status != session.StatusProvisioning {
		return s, session.ErrNotLive
	}
	s.Status, s.ReadyAt, s.Nodes = session.StatusRunning, at, nodes
	m.rows[id] = s
	return s, nil
}

func (m *memStore) RecentOpens(_ context.Context, student string, since time.Time, limit int) ([]time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []time.Time
	for _, s := range m.rows {
		if s.Student == student && s.StartedAt.After(since) {
			out = append(out, s.StartedAt)
		}
	}
	slices.SortFunc(out, func(a, b time.Time) int { return b.Compare(a) })
	return out[:min(len(out), limit)], nil
}

func (m *memStore) SetNodes(_ context.Context, id string, nodes []session.Node) (session.Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.rows[id]
	if s.Status != session.StatusRunning {
		return s, session.ErrNotLive
	}
	s.Nodes = nodes
	m.rows[id] = s
	return s, nil
}

func (m *memStore) Extend(context.Context, string, time.Time, time.Time) (session.Session, error) {
	return session.Session{}, errors.New("not used by seating")
}

// GetSettled is Get: the memory store has no row locks to wait for.
func (m *memStore) GetSettled(ctx context.Context, id string) (session.Session, error) {
	return m.Get(ctx, id)
}

func (m *memStore) FinishIf(_ context.Context, id string, due func(session.Session) bool,
	act func(session.Session) (session.EndReason, error), at time.Time) (session.Session, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.rows[id]
	if !ok {
		return s, false, session.ErrNoSession
	}
	if !s.Status.Live() || !due(s) {
		return s, false, nil
	}
	reason, err := act(s)
	if err != nil {
		return s, false, err
	}
	s.Status, s.End, s.FinishedAt = reason.Status(), reason, at
	m.rows[id] = s
	return s, true, nil
}

func (m *memStore) LockCapacity(ctx context.Context) (func(), error) {
	if m.onLock != nil {
		m.onLock()
	}
	if m.blocked {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return func() {}, nil
}

// finishLive finishes the one live row, as the reaper or a close would.
func (m *memStore) finishLive(reason session.EndReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, r := range m.rows {
		if r.Status.Live() {
			r.Status, r.End = reason.Status(), reason
			m.rows[id] = r
		}
	}
}

// fakeCluster counts VMs, records calls and fails where told.
type fakeCluster struct {
	vms, pods    int
	countErr     error
	provisionErr error
	teardownErr  error
	provisioned  []string
	tornDown     []string
	// onProvision runs in the middle of Provision.
	onProvision func()
}

func (f *fakeCluster) CountVMs(context.Context) (int, error)           { return f.vms, f.countErr }
func (f *fakeCluster) CountWorkspacePods(context.Context) (int, error) { return f.pods, f.countErr }

func (f *fakeCluster) Provision(_ context.Context, s session.Session, lab labs.Lab) error {
	f.provisioned = append(f.provisioned, s.ID)
	if f.onProvision != nil {
		f.onProvision()
	}
	if f.provisionErr == nil && lab.Kind == labs.KindPod {
		f.pods++
	} else if f.provisionErr == nil {
		f.vms += lab.VMCount()
	}
	return f.provisionErr
}

func (f *fakeCluster) Observe(_ context.Context, s session.Session) ([]session.NodeState, error) {
	var out []session.NodeState
	for _, n := range s.Nodes {
		out = append(out, session.NodeState{Name: n.Name, Exists: true})
	}
	return out, nil
}

func (f *fakeCluster) Teardown(_ context.Context, s session.Session) error {
	f.tornDown = append(f.tornDown, s.ID)
	return f.teardownErr
}

// countingMetrics counts the line's events as "lab event".
type countingMetrics struct {
	mu     sync.Mutex
	events map[string]float64
}

func (m *countingMetrics) QueueEvent(lab string, ev QueueEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events[lab+" "+string(ev)]++
}

func (m *countingMetrics) PoolClaimed(string, ClaimResult) {}

const catalogYAML = `labs:
- {name: one, kind: vm, nodes: [{role: vm}], disk: {containerDisk: img}}
- {name: three, kind: vm, nodes: [{role: control}, {role: worker, count: 2}], disk: {containerDisk: img}}
- {name: shell, kind: pod, image: img, nodes: [{role: workspace}]}
`

// newService is a session.Service whose opens are seated by an Usher over
// store and c, as the entry points wire them; with changes Usher's
// configuration before it is built.
func newService(t *testing.T, c *fakeCluster, now *time.Time, store *memStore, with ...func(*Config)) *session.Service {
	t.Helper()
	cat, err := labs.Parse([]byte(catalogYAML))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	clock := func() time.Time { return *now }
	rows := &session.Starter{
		Store: store, Cluster: c, CleanupTimeout: time.Second,
		Policy: lifetime.Policy{Lifetime: time.Hour, MaxLifetime: 3 * time.Hour},
		Now:    clock, Log: log,
	}
	cfg := Config{Rows: rows, Store: store, Cluster: c, Labs: cat, Now: clock, Log: log,
		Limits: Limits{MaxVMs: 4, MaxPods: 4, CapacityWait: time.Minute, CleanupTimeout: time.Second}}
	for _, w := range with {
		w(&cfg)
	}
	return &session.Service{Starter: rows, Labs: cat, Seating: NewUsher(cfg)}
}

func TestOpenDecisions(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	tests := []struct {
		name         string
		cluster      fakeCluster
		lab          string
		wantErr      error
		wantStatus   session.Status
		wantTeardown bool
		wantReason   string
	}{
		{"fits", fakeCluster{vms: 1}, "three", nil, session.StatusProvisioning, false, ""},
		{"one VM too many is refused before creating anything", fakeCluster{vms: 2}, "three", session.ErrNoCapacity, session.StatusFailed, false, "2 of 4 VMs"},
		{"pod labs need no VM capacity", fakeCluster{vms: 4}, "shell", nil, session.StatusProvisioning, false, ""},
		{"count failure falls back to the quota", fakeCluster{vms: 99, countErr: errors.New("forbidden")}, "one", nil, session.StatusProvisioning, false, ""},
		{"quota refusal is no_capacity and rolled back", fakeCluster{provisionErr: errors.Join(session.ErrNoCapacity, errors.New("exceeded quota"))}, "one", session.ErrNoCapacity, session.StatusFailed, true, "exceeded quota"},
		{"other failure is rolled back", fakeCluster{provisionErr: errors.New("boom")}, "three", session.ErrProvisioning, session.StatusFailed, true, "boom"},
		{"failed rollback still frees the student", fakeCluster{provisionErr: errors.New("boom"), teardownErr: errors.New("api down")}, "one", session.ErrProvisioning, session.StatusFailed, true, "cleanup incomplete, left for the reaper: api down"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := t0
			c := tc.cluster
			store := newStore()
			svc := newService(t, &c, &now, store)
			s, err := svc.Open(context.Background(), "ann", tc.lab, "")
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Open error = %v, want %v", err, tc.wantErr)
			}
			row, _ := store.Get(context.Background(), s.ID())
			if row.Status != tc.wantStatus || !strings.Contains(row.End.Detail, tc.wantReason) {
				t.Errorf("row = %s %q, want %s containing %q", row.Status, row.End, tc.wantStatus, tc.wantReason)
			}
			if got := len(c.tornDown) > 0; got != tc.wantTeardown {
				t.Errorf("teardown called = %v, want %v", got, tc.wantTeardown)
			}
			if tc.wantStatus == session.StatusFailed {
				c.provisionErr, c.countErr, c.vms = nil, nil, 0
				if _, err := svc.Open(context.Background(), "ann", tc.lab, ""); err != nil {
					t.Errorf("retry after failure = %v", err)
				}
			}
		})
	}
}

// An open whose row is finished by someone else (the reaper's ghost rule,
// a close) while it queues for capacity or creates objects never reports
// success: it creates nothing (or deletes what it created), leaves the
// finisher's status on the row, and returns session.ErrEndedWhileProvisioning.
func TestOpenOfAnEndedRow(t *testing.T) {
	ghost := session.EndReason{Kind: session.EndGhost, Actor: session.ActorReaper, Detail: "never became ready"}
	closed := session.EndReason{Kind: session.EndClosed, Actor: session.ActorStudent, Detail: "closed by student ann"}
	tests := []struct {
		name          string
		lab           string
		during        string // "lock" or "provision"
		finisher      session.EndReason
		wantProvision bool
		wantTeardown  bool
	}{
		{"reaper fails the row while queued for capacity", "one", "lock", ghost, false, false},
		{"student closes while queued for capacity", "three", "lock", closed, false, false},
		{"reaper fails the row while VMs are created", "one", "provision", ghost, true, true},
		{"student closes while VMs are created", "three", "provision", closed, true, true},
		{"student closes while the workspace Pod is created", "shell", "provision", closed, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
			c := &fakeCluster{}
			store := newStore()
			svc := newService(t, c, &now, store)
			finish := func() { store.finishLive(tc.finisher) }
			if tc.during == "lock" {
				store.onLock = finish
			} else {
				c.onProvision = finish
			}
			opened, err := svc.Open(context.Background(), "ann", tc.lab, "")
			if !errors.Is(err, session.ErrEndedWhileProvisioning) || !errors.Is(err, session.ErrProvisioning) || opened.Session == nil {
				t.Fatalf("Open = %+v, %v; want the row with session.ErrEndedWhileProvisioning (an session.ErrProvisioning)", opened, err)
			}
			s := opened.Session
			if diff := cmp.Diff(tc.finisher, s.End); diff != "" || s.Status != tc.finisher.Status() {
				t.Errorf("returned row %s: want the finisher's reason (-want +got):\n%s", s.Status, diff)
			}
			if row, _ := store.Get(context.Background(), s.ID); row.Status != tc.finisher.Status() {
				t.Errorf("stored row = %s, want %s", row.Status, tc.finisher.Status())
			}
			if got := len(c.provisioned) > 0; got != tc.wantProvision {
				t.Errorf("provisioned = %v, want %v", got, tc.wantProvision)
			}
			if got := len(c.tornDown) > 0; got != tc.wantTeardown {
				t.Errorf("torn down = %v, want %v", got, tc.wantTeardown)
			}
		})
	}
}

// The capacity-lock wait is bounded: past CapacityWait the open is
// no_capacity (retry later), the row is failed and nothing was created. A
// caller that went away is not reported as no_capacity.
func TestCapacityWaitIsBounded(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{}
	store := newStore()
	store.blocked = true
	svc := newService(t, c, &now, store, func(cfg *Config) { cfg.Limits.CapacityWait = 20 * time.Millisecond })
	s, err := svc.Open(context.Background(), "ann", "one", "")
	if !errors.Is(err, session.ErrNoCapacity) || !strings.Contains(err.Error(), "waited 20ms for the capacity lock") {
		t.Fatalf("Open with the lock held = %v, want session.ErrNoCapacity after the wait", err)
	}
	if row, _ := store.Get(context.Background(), s.ID()); row.Status != session.StatusFailed || len(c.provisioned) > 0 {
		t.Errorf("row = %s, provisioned %v; want failed and nothing created", row.Status, c.provisioned)
	}

	svc = newService(t, c, &now, store)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = svc.Open(ctx, "bob", "one", "")
	if err == nil || errors.Is(err, session.ErrNoCapacity) {
		t.Errorf("Open whose caller went away = %v, want a non-capacity error", err)
	}
}

// Joining, being served, being dropped for not polling and leaving are
// each counted once, by lab.
func TestWaitlistEventsAreCounted(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{vms: 4} // the VM limit is reached
	store := newStore()
	counted := &countingMetrics{events: map[string]float64{}}
	svc := newService(t, c, &now, store, func(cfg *Config) {
		cfg.Limits.QueueIdle = 2 * time.Minute
		cfg.Waitlist = &memWaitlist{store: store}
		cfg.Metrics = counted
	})
	ctx := context.Background()
	// where is where the student stands: waiting in the line, or their
	// session's status.
	const waiting = "waiting"
	where := func(st session.Standing) string {
		if st.Waiting != nil {
			return waiting
		}
		if st.Session != nil {
			return string(st.Session.Status)
		}
		return "nowhere"
	}
	status := func(student string) string {
		t.Helper()
		st, err := svc.Get(ctx, student, "")
		if err != nil {
			t.Fatalf("%s's getSession: %v", student, err)
		}
		return where(st)
	}

	for _, student := range []string{"ann", "bob", "cid"} {
		if st, err := svc.OpenWaiting(ctx, student, "one", ""); err != nil || st.Waiting == nil {
			t.Fatalf("%s's open with wait = %s, %v; want waiting", student, where(st), err)
		}
	}
	if _, err := svc.Close(ctx, "cid", "", session.ActorStudent, "cid"); err != nil {
		t.Fatalf("cid leaving the line: %v", err)
	}
	// Only bob polls: ann loses her place.
	now = now.Add(time.Minute)
	status("bob")
	now = now.Add(90 * time.Second)
	if got := status("bob"); got != waiting {
		t.Fatalf("bob is %s, want waiting", got)
	}
	if _, err := svc.Get(ctx, "ann", ""); err == nil {
		t.Fatal("ann kept her place without polling")
	}
	// A VM frees: bob's poll serves him.
	c.vms = 0
	if got := status("bob"); got != string(session.StatusProvisioning) {
		t.Fatalf("bob is %s once a VM freed, want provisioning", got)
	}

	got := counted.events
	want := map[string]float64{"one joined": 3, "one left": 1, "one dropped": 1, "one served": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("waitlist events (-want +got):\n%s", diff)
	}
}

// A student who joins the line gets the generated private key in the
// answer to that open only: a repeated open and a poll give back the same
// place without it.
func TestWaitingIsIssuedTheKeyOnce(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{vms: 4} // the VM limit is reached
	store := newStore()
	svc := newService(t, c, &now, store, func(cfg *Config) { cfg.Waitlist = &memWaitlist{store: store} })
	ctx := context.Background()
	type answer struct {
		ID       string
		Position int
		Key      bool
	}
	waitingOf := func(call string, st session.Standing, err error) answer {
		t.Helper()
		if err != nil || st.Waiting == nil {
			t.Fatalf("%s = %+v, %v; want a place in the line", call, st, err)
		}
		return answer{st.Waiting.ID, st.Waiting.Place.Position, st.Waiting.StudentPrivateKey != ""}
	}
	st, err := svc.OpenWaiting(ctx, "ann", "one", "")
	joined := waitingOf("open with wait", st, err)
	if !joined.Key || joined.Position != 1 {
		t.Fatalf("joining answer = %+v, want place 1 with the generated key", joined)
	}
	again := answer{ID: joined.ID, Position: 1}
	for _, tc := range []struct {
		name string
		call func() (session.Standing, error)
	}{
		{"repeated open with wait", func() (session.Standing, error) { return svc.OpenWaiting(ctx, "ann", "one", "") }},
		{"repeated open without wait", func() (session.Standing, error) { return svc.Open(ctx, "ann", "one", "") }},
		{"poll", func() (session.Standing, error) { return svc.Get(ctx, "ann", "") }},
		{"poll by id", func() (session.Standing, error) { return svc.Get(ctx, "ann", joined.ID) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := tc.call()
			if diff := cmp.Diff(again, waitingOf(tc.name, st, err)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A student who stopped polling for longer than QueueIdle has lost their
// place even when nobody else polled meanwhile: their own late poll does
// not revive the entry, and it is gone once the line is counted.
func TestAnIdleEntryIsNotRevivedByItsOwnPoll(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{vms: 4} // the VM limit is reached
	store := newStore()
	w := &memWaitlist{store: store}
	svc := newService(t, c, &now, store, func(cfg *Config) {
		cfg.Limits.QueueIdle = 2 * time.Minute
		cfg.Waitlist = w
	})
	ctx := context.Background()
	if st, err := svc.OpenWaiting(ctx, "ann", "one", ""); err != nil || st.Waiting == nil {
		t.Fatalf("ann's open with wait = %+v, %v; want waiting", st, err)
	}
	now = now.Add(2*time.Minute + time.Second)
	for range 2 {
		if st, err := svc.Get(ctx, "ann", ""); !errors.Is(err, session.ErrNoSession) {
			t.Fatalf("ann's poll after she went idle = %+v, %v; want no session", st, err)
		}
	}
	if st, err := svc.OpenWaiting(ctx, "bob", "one", ""); err != nil || st.Waiting == nil || st.Waiting.Place.Position != 1 {
		t.Fatalf("bob's open with wait = %+v, %v; want first in line", st.Waiting, err)
	}
}

// slowLock is a store whose capacity lock excludes (one holder at a
// time), is held at least hold, and counts how often it was taken.
type slowLock struct {
	*memStore
	sem   chan struct{}
	hold  time.Duration
	taken atomic.Int32
}

func (s *slowLock) LockCapacity(ctx context.Context) (func(), error) {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.taken.Add(1)
	time.Sleep(s.hold)
	return func() { <-s.sem }, nil
}

// A burst of 30 students at a 4-VM capacity: exactly 4 are admitted, and
// the refusals come from the counts the decisions before them made while
// they waited, most without taking the capacity lock at all (with every
// open taking it, it would be taken 30 times); a student who would wait
// joins the line instead, under the lock.
func TestABurstIsRefusedWithoutTheLock(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{}
	store := &slowLock{memStore: newStore(), sem: make(chan struct{}, 1), hold: 20 * time.Millisecond}
	svc := newService(t, c, &now, store.memStore, func(cfg *Config) {
		cfg.Store = store
		cfg.Waitlist = &memWaitlist{store: store.memStore}
		cfg.Limits.QueueIdle = time.Hour
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var opened, refused int
	var other []error
	for i := range 30 {
		wg.Go(func() {
			_, err := svc.Open(context.Background(), fmt.Sprintf("s-%d", i), "one", "")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				opened++
			case errors.Is(err, session.ErrNoCapacity) && strings.Contains(err.Error(), "4 of 4 VMs in use"):
				refused++
			default:
				other = append(other, err)
			}
		})
	}
	wg.Wait()
	if opened != 4 || refused != 26 || len(other) > 0 || c.vms != 4 {
		t.Fatalf("%d opened, %d refused naming the full capacity, others %v, %d VMs; want 4, 26, none, 4", opened, refused, other, c.vms)
	}
	if n := store.taken.Load(); n >= 30 {
		t.Errorf("the capacity lock was taken %d times for 30 opens; want the refusals decided without it", n)
	}
	st, err := svc.OpenWaiting(context.Background(), "late", "one", "")
	if err != nil || st.Waiting == nil {
		t.Errorf("an open that waits after the burst = %+v, %v; want a place in line", st, err)
	}
}
