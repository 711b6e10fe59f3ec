package stacktest

import (
	"testing"
	"time"
)

// PollInterval is how often Eventually asks again.
const PollInterval = 50 * time.Millisecond

// Eventually calls cond until it reports done, and fails the test with
// cond's last why if that does not happen within timeout. It is the one
// way these suites wait for the cluster or the database to settle: the
// timeout is a bound on a hang, never a speed requirement, so choose it
// generously. cond runs on the test's goroutine and may use t.
func Eventually(t testing.TB, timeout time.Duration, cond func() (done bool, why string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, why := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, why)
		}
		time.Sleep(PollInterval)
	}
}
