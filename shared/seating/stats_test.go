package seating

import (
	"labkeep/shared/session"

	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A lab's line counts the entries still polled within the idle time, and
// its oldest wait is the earliest of them's time since joining; every lab
// of the catalog has a line (empty ones too), and a lab that left the
// catalog keeps its own while someone waits for it.
func TestQueueStatsOf(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	idle := 2 * time.Minute
	entry := func(lab string, joined, polled time.Duration) Entry {
		return Entry{Lab: lab, EnqueuedAt: now.Add(-joined), PolledAt: now.Add(-polled)}
	}
	tests := []struct {
		name string
		line []Entry
		want []QueueStat
	}{
		{"nobody waits: every lab at 0", nil,
			[]QueueStat{{Lab: "one"}, {Lab: "shell"}}},
		{"the oldest wait is the earliest joiner's, since joining", []Entry{
			entry("one", 5*time.Minute, 10*time.Second),
			entry("one", 40*time.Minute, 3*time.Second),
			entry("shell", 90*time.Second, 0),
		}, []QueueStat{{Lab: "one", Length: 2, OldestWait: 40 * time.Minute}, {Lab: "shell", Length: 1, OldestWait: 90 * time.Second}}},
		{"an entry not polled within the idle time has lost its place", []Entry{
			entry("one", time.Hour, idle+time.Second),
			entry("one", 3*time.Minute, idle),
		}, []QueueStat{{Lab: "one", Length: 1, OldestWait: 3 * time.Minute}, {Lab: "shell"}}},
		{"a lab that left the catalog keeps its line", []Entry{entry("gone", time.Minute, 0)},
			[]QueueStat{{Lab: "gone", Length: 1, OldestWait: time.Minute}, {Lab: "one"}, {Lab: "shell"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := QueueStatsOf([]string{"shell", "one"}, tc.line, now, idle)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// lineOnly is a Waitlist whose Line answers line; QueueStats reads
// nothing else.
type lineOnly struct {
	Waitlist
	line []Entry
}

func (l lineOnly) Line(context.Context) ([]Entry, error) { return l.line, nil }

// memWaitlist is an in-memory Waitlist over a memStore (Promote inserts
// the row there); the real one's guarantees are pgstore's, on PostgreSQL.
type memWaitlist struct {
	mu    sync.Mutex
	store *memStore
	line  []Entry
	seq   int64
}

func (w *memWaitlist) Enqueue(_ context.Context, e Entry) (Entry, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.line {
		if x.Student == e.Student {
			return x, session.ErrSessionExists
		}
	}
	w.seq++
	e.Seq = w.seq
	w.line = append(w.line, e)
	w.store.mu.Lock()
	delete(w.store.rows, e.ID)
	w.store.mu.Unlock()
	return e, nil
}

func (w *memWaitlist) Line(context.Context) ([]Entry, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.line), nil
}

// take removes the entries drop picks and returns them.
func (w *memWaitlist) take(drop func(Entry) bool) []Entry {
	var out []Entry
	w.line = slices.DeleteFunc(w.line, func(e Entry) bool {
		if drop(e) {
			out = append(out, e)
			return true
		}
		return false
	})
	return out
}

func (w *memWaitlist) Touch(_ context.Context, student string, at, since time.Time) (Entry, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, e := range w.line {
		if e.Student == student && !e.PolledAt.Before(since) {
			if at.After(e.PolledAt) {
				w.line[i].PolledAt = at
			}
			return w.line[i], nil
		}
	}
	return Entry{}, session.ErrNoSession
}

func (w *memWaitlist) Leave(_ context.Context, student string) (Entry, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if out := w.take(func(e Entry) bool { return e.Student == student }); len(out) == 1 {
		return out[0], nil
	}
	return Entry{}, session.ErrNoSession
}

func (w *memWaitlist) DropIdle(_ context.Context, before time.Time) ([]Entry, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.take(func(e Entry) bool { return e.PolledAt.Before(before) }), nil
}

func (w *memWaitlist) Promote(ctx context.Context, s session.Session) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.take(func(e Entry) bool { return e.ID == s.ID })) == 0 {
		return session.ErrNoSession
	}
	return w.store.Create(ctx, s)
}

func (w *memWaitlist) RecentlyEnded(context.Context, time.Time, int) ([]session.Session, error) {
	return nil, nil
}
