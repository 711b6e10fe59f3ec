// Package poll is how guardian's tests wait for the kernel, a child
// process or guardian's own loops to settle: ask again every Interval
// until the condition holds or a bound ends. The bound only stops a
// broken test; nothing is asserted about how long the wait took.
//
// labkeep's tests have the same helper in localrun/poll; guardian keeps
// its own because guardian and labkeep share no Go package (guardian is
// the sidecar, built and tested on its own).
package poll

import (
	"testing"
	"time"
)

// Interval is how often Until and Eventually ask again.
const Interval = 10 * time.Millisecond

// Until calls cond every Interval until it holds, and reports whether it
// did within d. cond is always called at least once.
func Until(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Interval)
	}
	return true
}

// Eventually calls cond until it reports done, and fails the test with
// cond's last why if that does not happen within d. cond runs on the
// test's goroutine and may use t.
func Eventually(t testing.TB, d time.Duration, cond func() (done bool, why string)) {
	t.Helper()
	var why string
	if !Until(d, func() (done bool) { done, why = cond(); return done }) {
		t.Fatalf("not within %s: %s", d, why)
	}
}
