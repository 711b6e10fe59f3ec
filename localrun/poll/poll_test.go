package poll

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Until returns as soon as cond is done, and once the context ends it
// returns cond's last why wrapping the context's error.
func TestUntil(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name      string
		ctx       context.Context
		doneAt    int // the call on which cond is done; 0 never
		wantCalls int
		wantErr   string
	}{
		{"done on the third call", context.Background(), 3, 3, ""},
		{"done on the first call of an ended context", ended, 1, 1, ""},
		{"an ended context", ended, 0, 1, "still pending (context canceled)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := Until(tc.ctx, func() (bool, string) {
				calls++
				return calls == tc.doneAt, "still pending"
			})
			if calls != tc.wantCalls {
				t.Errorf("cond called %d times, want %d", calls, tc.wantCalls)
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Until = %v, want nil", err)
			case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr || !errors.Is(err, context.Canceled)):
				t.Errorf("Until = %v, want %q wrapping context.Canceled", err, tc.wantErr)
			}
		})
	}
}

// Eventually fails the test with cond's last why when the timeout ends,
// and passes as soon as cond is done.
func TestEventually(t *testing.T) {
	tests := []struct {
		name       string
		done       bool
		wantFailed bool
	}{
		{"done", true, false},
		{"never done", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			Eventually(rec, 3*Interval, func() (bool, string) { return tc.done, "never" })
			if rec.failed != tc.wantFailed || (rec.failed && !strings.Contains(rec.msg, "never (context deadline exceeded)")) {
				t.Errorf("failed = %v (%q), want %v with cond's last why", rec.failed, rec.msg, tc.wantFailed)
			}
		})
	}
}

// recorder notes a Fatalf instead of stopping the test, so a failure can
// be asserted.
type recorder struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, fmt.Sprintf(format, args...)
}
