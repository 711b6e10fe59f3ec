// Package scale_test holds the table benchmarks of `make bench` that load
// the control plane and the database at scale: a burst of students opening
// at once, the reaper's cost against thousands of rows and a thousand live
// sessions, and the session functions' own cost under concurrent
// students. Each figure is recorded with its baseline from the same run,
// against the same API server and database (localrun/benchtable).
package scale_test

import (
	"testing"
	"time"

	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/localrun/virtsim"
)

var st *stack.Stack

// liveBoot is virtsim's delay from a VMI's creation to Ready.
const liveBoot = 300 * time.Millisecond

// The stack has no node: a thousand sessions' anchor Pods stay Pending
// instead of starting a thousand containers on the machine being measured;
// what is measured here is the control plane's and the database's work,
// which a node does not change (virtsim still runs every VM's VMI and
// launcher Pod objects). The package has benchmarks only, so a run that
// asks for none (`make test`) starts no stack.
func TestMain(m *testing.M) {
	stacktest.BenchMain(m, &st, stack.Options{NoNode: true, VirtSim: virtsim.Options{BootDelay: liveBoot}})
}
