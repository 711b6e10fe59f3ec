package rate

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestAllow(t *testing.T) {
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	three := Limit{Max: 3, Per: time.Minute}
	ago := func(ds ...time.Duration) []time.Time {
		var out []time.Time
		for _, d := range ds {
			out = append(out, now.Add(-d))
		}
		return out
	}
	tests := []struct {
		name      string
		limit     Limit
		recent    []time.Time
		wantRetry time.Duration // 0: allowed
	}{
		{"no events yet", three, nil, 0},
		{"fewer than the max in the window", three, ago(time.Second, 2*time.Second), 0},
		{"the max reached: until the oldest leaves the window", three, ago(time.Second, 10*time.Second, 40*time.Second), 20 * time.Second},
		{"never less than a second", three, ago(0, 0, 59900*time.Millisecond), time.Second},
		{"whole seconds, rounded up", three, ago(0, 0, 30500*time.Millisecond), 30 * time.Second},
		{"no bound", Limit{}, ago(0, 0, 0, 0), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.limit.Allow(tt.recent, now)
			var got time.Duration
			var ex *Exceeded
			if errors.As(err, &ex) {
				got = ex.RetryAfter
			} else if err != nil {
				t.Fatalf("Allow = %v", err)
			}
			if diff := cmp.Diff(tt.wantRetry, got); diff != "" {
				t.Errorf("retry after (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		limit Limit
		want  string // the message's start; "" = valid
	}{
		{"no bound", Limit{}, ""},
		{"a bound", Limit{Max: 5, Per: time.Minute}, ""},
		{"a negative max", Limit{Max: -1, Per: time.Minute}, "Max: must be at least 0, got -1"},
		{"a bound without a window", Limit{Max: 5}, "Per: must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.limit.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate = %v, want valid", err)
			case tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tt.want)):
				t.Errorf("Validate = %v, want %q…", err, tt.want)
			}
		})
	}
}
