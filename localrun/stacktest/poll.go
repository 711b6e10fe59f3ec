package stacktest

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// PollInterval is how often Eventually and Until ask again.
const PollInterval = 50 * time.Millisecond

// Eventually calls cond until it reports done, and fails the test with
// cond's last why if that does not happen within timeout. It is the one
// way these suites wait for the cluster or the database to settle: the
// timeout is a bound on a hang, never a speed requirement, so choose it
// generously. cond runs on the test's goroutine and may use t.
func Eventually(t testing.TB, timeout time.Duration, cond func() (done bool, why string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := Until(ctx, cond); err != nil {
		t.Fatalf("not within %s: %v", timeout, err)
	}
}

// Until calls cond until it reports done and returns nil, or returns an
// error with cond's last why once ctx ends: Eventually for set-up code
// that has no test to fail (TestMain). cond is always called at least
// once.
func Until(ctx context.Context, cond func() (done bool, why string)) error {
	for {
		done, why := cond()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s (%w)", why, ctx.Err())
		case <-time.After(PollInterval):
		}
	}
}
