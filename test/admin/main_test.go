// Package admin_test checks the admin side of labkeep against the real
// local stack (the functions wired by app.Build, PostgreSQL, the control
// plane, and the real node where one can run): guardian's alert endpoint
// (POST /guardianAlert) with its per-session credentials and bounds, and
// the admin console (shared/portal's admin.html) in a real headless
// Chromium (localrun/browser) — a reaper run refused by the real API
// server, Reap now and its preview, force-close and a guardian alert.
package admin_test

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
