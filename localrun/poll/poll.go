// Package poll is the one way labkeep's tests wait for something outside
// them to settle (a cluster, a database, a child process): ask again every
// Interval until the condition holds or a bound ends. It imports nothing
// of labkeep, so any test package can use it, the control plane's own
// tests included; stacktest re-exports it for the integration suites.
package poll

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Interval is how often Eventually and Until ask again.
const Interval = 50 * time.Millisecond

// Eventually calls cond until it reports done, and fails the test with
// cond's last why if that does not happen within timeout. The timeout is a
// bound on a hang, never a speed requirement, so choose it generously.
// cond runs on the test's goroutine and may use t (t.Fatal included).
func Eventually(t testing.TB, timeout time.Duration, cond func() (done bool, why string)) {
	t.Helper()
	EventuallyEvery(t, timeout, Interval, cond)
}

// EventuallyEvery is Eventually asking every every instead of Interval:
// for a condition whose asking costs the system under test what it is
// measuring (an exec or a log read through an emulated node's kubelet).
func EventuallyEvery(t testing.TB, timeout, every time.Duration, cond func() (done bool, why string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := until(ctx, every, cond); err != nil {
		t.Fatalf("not within %s: %v", timeout, err)
	}
}

// Until calls cond until it reports done and returns nil, or returns an
// error with cond's last why once ctx ends: Eventually for set-up code
// that has no test to fail (TestMain). cond is always called at least
// once.
func Until(ctx context.Context, cond func() (done bool, why string)) error {
	return until(ctx, Interval, cond)
}

func until(ctx context.Context, every time.Duration, cond func() (done bool, why string)) error {
	for {
		done, why := cond()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s (%w)", why, ctx.Err())
		case <-time.After(every):
		}
	}
}
