// Package portal_test drives the student page (shared/portal) in a real
// headless Chromium (localrun/browser) against the real local stack: the
// functions wired by app.Build as in production, PostgreSQL, the control
// plane, and a Pod lab whose workspace Pod runs on the real node
// (containerd, runc, kubelet). A student signs in with the portal's token,
// opens the shell lab, watches it provision, logs in over SSH with what
// the page shows, follows the countdown and its warnings, extends up to
// the cap and closes; the page's messages for refusals and endings are
// checked against the server's own sentences. Every step leaves a
// screenshot under the browser package's artifact directory (logged).
//
// Expiry is reached by moving the functions' clock (stacktest.Clock)
// forward, never the browser's: the page must follow the server's
// remainingSeconds, not the computer's clock.
package portal_test

import (
	"testing"
	"time"

	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/localrun/virtsim"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	stacktest.Main(m, &st, stack.Options{VirtSim: virtsim.Options{BootDelay: 500 * time.Millisecond}})
}
