package session

import (
	"context"
	"errors"
	"testing"
	"time"

	"labkeep/shared/rate"
)

// Opens past the rate are refused with when to retry, and write no row;
// answers that write none (the live session) are not counted.
func TestOpenPastTheRateWritesNothing(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	c := &fakeCluster{provisionErr: ErrNoCapacity}
	svc, store := newService(t, c, &now)
	svc.OpenRate = OpenRate{Max: 2, Per: time.Minute}
	for i := range 2 {
		if _, err := svc.Open(context.Background(), "ann", "one", ""); !errors.Is(err, ErrNoCapacity) {
			t.Fatalf("open %d = %v, want no capacity", i, err)
		}
		now = now.Add(10 * time.Second)
	}
	rows := len(store.rows)
	_, err := svc.Open(context.Background(), "ann", "one", "")
	var ex *rate.Exceeded
	if !errors.Is(err, ErrTooManyOpens) || !errors.As(err, &ex) || ex.RetryAfter != 40*time.Second {
		t.Fatalf("third open = %v, want too many opens, retry in 40s", err)
	}
	if len(store.rows) != rows {
		t.Errorf("the refused open wrote %d rows", len(store.rows)-rows)
	}
	if _, err := svc.Open(context.Background(), "bob", "one", ""); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("another student's open = %v, want it counted apart (no capacity)", err)
	}
	now = now.Add(40 * time.Second)
	if _, err := svc.Open(context.Background(), "ann", "one", ""); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("open once the oldest left the window = %v, want it allowed (no capacity)", err)
	}
}
