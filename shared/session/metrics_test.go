package session

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// counted is a Metrics that counts what it is told, keyed
// "event{label=value,…}" (labels sorted), as functions/app keys its
// series.
type counted struct {
	mu sync.Mutex
	n  map[string]float64
}

func (c *counted) add(event string, labels ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	slices.Sort(labels)
	if c.n == nil {
		c.n = map[string]float64{}
	}
	c.n[event+"{"+strings.Join(labels, ",")+"}"]++
}

func (c *counted) Opened(lab string, o Outcome)      { c.add("opened", "lab="+lab, "outcome="+string(o)) }
func (c *counted) Ready(lab string, _ time.Duration) { c.add("ready", "lab="+lab) }
func (c *counted) Extended(o Outcome)                { c.add("extended", "outcome="+string(o)) }
func (c *counted) Ended(kind EndKind, a Actor) {
	c.add("ended", "kind="+string(kind), "actor="+string(a))
}

func (c *counted) counts() map[string]float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// liveRows is memStore with ListLive answering from its rows.
type liveRows struct{ *memStore }

func (l liveRows) ListLive(context.Context) ([]Session, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Session
	for _, s := range l.rows {
		if s.Status.Live() {
			out = append(out, s)
		}
	}
	return out, nil
}

// A student's open, extensions and close, a refused open and a failed one
// are each reported to Metrics; CountLive counts the students' live
// sessions from the store (functions/app turns both into series).
func TestMetricsCountWhatTheServiceDoes(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{ready: true}
	store := &memStore{rows: map[string]Session{}}
	metrics := &counted{}
	svc := newServiceOn(t, liveRows{store}, c, &now, metrics)
	ctx := context.Background()

	opened, err := svc.Open(ctx, "ann", "one", "")
	if err != nil {
		t.Fatal(err)
	}
	s := opened.Session
	if _, err := svc.Open(ctx, "bob", "no-such-lab", ""); !errors.Is(err, ErrUnknownLab) {
		t.Fatalf("open of an unknown lab = %v", err)
	}
	if _, err := svc.Open(ctx, "ann", "three", ""); !errors.Is(err, ErrSessionExists) {
		t.Fatalf("second open = %v", err)
	}
	if _, err := svc.Open(ctx, "cid", "shell", ""); err != nil {
		t.Fatal(err)
	}
	live, err := svc.CountLive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []LiveCount{{Lab: "shell", Status: StatusProvisioning, N: 1}}; !slices.Contains(live, want[0]) {
		t.Errorf("live counts = %v, want one provisioning shell session among them", live)
	}
	now = now.Add(40 * time.Second)
	if _, err := svc.Extend(ctx, "ann", s.ID); err != nil { // Extend observes the VM ready first
		t.Fatal(err)
	}
	if _, err := svc.Extend(ctx, "ann", "other-id"); !errors.Is(err, ErrNoSession) {
		t.Fatalf("extend of a foreign id = %v", err)
	}
	c.provisionErr = errors.New("admission denied")
	if _, err := svc.Open(ctx, "dee", "one", ""); !errors.Is(err, ErrProvisioning) {
		t.Fatalf("failing open = %v", err)
	}
	c.provisionErr = nil
	if _, err := svc.Close(ctx, "ann", s.ID, ActorStudent, "ann"); err != nil {
		t.Fatal(err)
	}

	// An unclaimed warm-pool instance is live but nobody's session yet:
	// neither counted live nor reported ready when it turns running.
	store.mu.Lock()
	pooled := Session{ID: "pool-1", Student: "labkeep:pool", Lab: "shell", Status: StatusRunning, Pool: PoolIdle, ReadyAt: now}
	store.rows[pooled.ID] = pooled
	store.mu.Unlock()
	svc.Ready(pooled)

	want := map[string]float64{
		"opened{lab=,outcome=unknown_lab}":            1,
		"opened{lab=one,outcome=ok}":                  1,
		"opened{lab=one,outcome=provisioning_failed}": 1,
		"opened{lab=shell,outcome=ok}":                1,
		"opened{lab=three,outcome=session_exists}":    1,
		"extended{outcome=ok}":                        1,
		"extended{outcome=no_session}":                1,
		"ready{lab=one}":                              1,
		"ended{actor=open,kind=provisioning_failed}":  1,
		"ended{actor=student,kind=closed}":            1,
	}
	if diff := cmp.Diff(want, metrics.counts()); diff != "" {
		t.Errorf("reported (-want +got):\n%s", diff)
	}
	live, err = svc.CountLive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]LiveCount{{Lab: "shell", Status: StatusProvisioning, N: 1}}, live); diff != "" {
		t.Errorf("live counts (-want +got):\n%s", diff)
	}
}

// An outcome is "ok", a sentinel's code (wrapped or not), or "error".
func TestOutcomeOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Outcome
	}{
		{nil, OutcomeOK},
		{ErrNoCapacity, "no_capacity"},
		{fmt.Errorf("%w: admission denied", ErrProvisioning), "provisioning_failed"},
		{errors.New("database down"), OutcomeError},
	} {
		if got := OutcomeOf(c.err); got != c.want {
			t.Errorf("OutcomeOf(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
