package session

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestOpenRateAllow(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	rate := OpenRate{Max: 3, Per: time.Minute}
	ago := func(ds ...time.Duration) []time.Time {
		var out []time.Time
		for _, d := range ds {
			out = append(out, now.Add(-d))
		}
		return out
	}
	tests := []struct {
		name      string
		rate      OpenRate
		recent    []time.Time
		wantRetry time.Duration // 0: allowed
	}{
		{"no opens yet", rate, nil, 0},
		{"fewer than the max in the window", rate, ago(time.Second, 2*time.Second), 0},
		{"the max reached: until the oldest leaves the window", rate, ago(time.Second, 10*time.Second, 40*time.Second), 20 * time.Second},
		{"never less than a second", rate, ago(0, 0, 59900*time.Millisecond), time.Second},
		{"no bound", OpenRate{}, ago(0, 0, 0, 0), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.rate.Allow(tt.recent, now)
			var got time.Duration
			var tm *TooManyOpensError
			if errors.As(err, &tm) {
				got = tm.RetryAfter
			} else if err != nil {
				t.Fatalf("Allow = %v", err)
			}
			if diff := cmp.Diff(tt.wantRetry, got); diff != "" {
				t.Errorf("retry after (-want +got):\n%s", diff)
			}
		})
	}
}

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
	var tm *TooManyOpensError
	if !errors.As(err, &tm) || tm.RetryAfter != 40*time.Second {
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
