// Package vmlab_test runs VM labs on real KubeVirt on the local stack's node
// (virt-api, virt-controller, virt-handler and virt-launcher of KubeVirt
// v1.7.0, guests under software emulation): students open the sample VM
// labs through the functions wired as in production and log in to a real
// guest that labkeep made, over SSH from the host with the session's own
// key and host key; the web terminal is the guest's serial console; a
// warm-pool guest takes its student's key through the guest agent; close,
// expiry and the anchor alone stop the guest's QEMU process; the quota
// counts the real virt-launcher Pod; k8s-cluster boots three guests; a VM
// the scheduler cannot place says why; and `make run`'s functions boot a
// real VM.
//
// The tests share one stack and run two at a time: the node has two CPUs,
// a guest under emulation keeps most of one busy while it boots, and the
// local labs size a one-VM lab's guest so that two fit
// (stack.LocalVMLabs); a VM that does not fit waits in the scheduler until
// one ends. make run's test and the anchor's run first, alone: the one
// sets the process's environment, the other's session lives only two
// minutes. Timings are logged, never asserted (speed lives in
// benchmarks).
package vmlab_test

import (
	"testing"
	"time"

	"labkeep/localrun/node"
	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
)

var st *stack.Stack

// bootWithin bounds a guest's way from its open to running: its boot
// under emulation (about a minute alone) and the wait in the scheduler
// while the test beside it holds the node's CPUs (k8s-cluster's three
// guests hold them for up to several minutes).
const bootWithin = 20 * time.Minute

func TestMain(m *testing.M) {
	stacktest.Main(m, &st, stack.Options{Node: node.Options{KubeVirt: true, NoWorkspaceImage: true}})
}
