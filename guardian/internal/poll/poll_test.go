package poll

import (
	"fmt"
	"testing"
)

// Until reports whether cond held within the bound, having asked until it
// did; Eventually fails the test with cond's last why when it never does.
func TestUntilAndEventually(t *testing.T) {
	tests := []struct {
		name      string
		doneAt    int // the call on which cond holds; 0 never
		wantOK    bool
		wantCalls int // at least
	}{
		{"holds at once", 1, true, 1},
		{"holds on the third call", 3, true, 3},
		{"never holds", 0, false, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			ok := Until(4*Interval, func() bool { calls++; return calls == tc.doneAt })
			if ok != tc.wantOK || calls < tc.wantCalls || (ok && calls != tc.doneAt) {
				t.Errorf("Until = %v after %d calls; want %v after at least %d", ok, calls, tc.wantOK, tc.wantCalls)
			}
			rec := &recorder{TB: t}
			calls = 0
			Eventually(rec, 4*Interval, func() (bool, string) { calls++; return calls == tc.doneAt, fmt.Sprint("call ", calls) })
			if rec.failed == tc.wantOK || (rec.failed && rec.msg != fmt.Sprintf("not within %s: call %d", 4*Interval, calls)) {
				t.Errorf("Eventually failed = %v (%q); want failed %v with the last why", rec.failed, rec.msg, !tc.wantOK)
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
