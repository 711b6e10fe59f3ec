// Package bench_test holds the table benchmarks of `make bench` that need
// the real local stack: one stack per test binary (control plane, a real
// node, virtsim, PostgreSQL), and a deployment of the functions per
// benchmark through stacktest.Deploy, wired as production. Every figure is
// recorded with its baseline from the same run (localrun/benchtable).
package bench_test

import (
	"testing"
	"time"

	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/localrun/virtsim"
)

var st *stack.Stack

// The stack has a node: a Pod lab's workspace Pod really runs (and its
// activeDeadlineSeconds is enforced by the real kubelet), and VM labs'
// virt-launcher Pods run there too. A run that asks for no benchmark
// (`make test`) starts no stack.
func TestMain(m *testing.M) {
	stacktest.BenchMain(m, &st, stack.Options{VirtSim: virtsim.Options{BootDelay: 500 * time.Millisecond}})
}
