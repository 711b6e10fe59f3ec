package stacktest

import "labkeep/localrun/poll"

// PollInterval is how often Eventually and Until ask again.
const PollInterval = poll.Interval

// Eventually and Until are poll's, the one way these suites wait for the
// cluster or the database to settle, here so a suite that uses stacktest
// needs no second import: Eventually fails the test with cond's last why
// once the timeout (a bound on a hang, never a speed requirement) ends;
// Until is the same for set-up code that has no test to fail (TestMain).
var (
	Eventually = poll.Eventually
	Until      = poll.Until
)
