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
// The tests share one stack and run one after another: the node has two
// CPUs and a guest under emulation keeps one busy while it boots. Timings
// are logged, never asserted (speed lives in benchmarks).
package vmlab_test

import (
	"testing"

	"labkeep/localrun/node"
	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	stacktest.Main(m, &st, stack.Options{Node: node.Options{KubeVirt: true, NoWorkspaceImage: true}})
}
