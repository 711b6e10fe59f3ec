// Package podlab_test runs Pod labs on the local stack's real node
// (containerd, runc, CNI bridge, kubelet, kube-scheduler): students open the
// sample shell lab through the functions wired as in production, reach its
// workspace Pod over SSH from the host with the session's own key and host
// key, and misbehave inside it as root while guardian, the kubelet and the
// deadlines keep the promises labkeep makes about Pod labs.
//
// The tests share one stack and run one after another: the node has two
// CPUs, a workspace Pod asks for one, and the memory and fork-bomb
// scenarios must not disturb each other's figures. Timings are logged, never
// asserted (speed lives in benchmarks).
package podlab_test

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
