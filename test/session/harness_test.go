// Package session_test runs the session functions end to end on the real
// local stack (kube-apiserver + etcd + kube-controller-manager, virtsim,
// PostgreSQL): HTTP requests in, real objects and rows out. The functions
// are wired as in production (stacktest.Deploy) and always run as the
// ServiceAccount bound by infra/base/rbac.yaml, never admin.
package session_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/localrun/virtsim"
	"labkeep/shared/kube"
)

var st *stack.Stack

// bootDelay is virtsim's VMI boot time in these tests.
const bootDelay = 500 * time.Millisecond

// neverReady starts the environment names whose VMs never boot.
const neverReady = "neverready"

// slowBoot starts the environment names whose VMs boot in vmBootDelay, a
// VM's boot to SSH rather than the stand-in's instant one (set, not
// measured: no guest runs here).
const (
	slowBoot    = "slowboot"
	vmBootDelay = 30 * time.Second
)

func TestMain(m *testing.M) {
	stacktest.Main(m, &st, stack.Options{
		VirtSim: virtsim.Options{
			BootDelay: bootDelay,
			Faults: func(vm *kubevirtv1.VirtualMachine) virtsim.Fault {
				f := virtsim.Fault{NeverReady: strings.HasPrefix(vm.Labels[kube.LabelEnv], neverReady)}
				if strings.HasPrefix(vm.Labels[kube.LabelEnv], slowBoot) {
					f.BootDelay = vmBootDelay
				}
				return f
			},
		},
	})
}

// newEnv deploys the functions on the suite's stack with o.
func newEnv(t testing.TB, o stacktest.Options) *stacktest.Deployment {
	t.Helper()
	return stacktest.Deploy(t, st, o)
}

// retryAfter is the Retry-After header e's functions send with 503
// no_capacity: LABKEEP_RETRY_AFTER in whole seconds.
func retryAfter(e *stacktest.Deployment) string {
	return strconv.Itoa(int(e.App.Config.RetryAfter / time.Second))
}

// internals are fragments of what the API server says when it refuses
// (ServiceAccount, quota and object names, admission policy messages);
// none may reach a student.
var internals = []string{"serviceaccount", "validatingadmissionpolicy", "quota", "injected fault", "denied", "forbidden", "lk-", "labkeep-vms"}

// noInternals fails if a response to a student carries cluster internals.
func noInternals(t testing.TB, what string, r stacktest.Response) {
	t.Helper()
	body := strings.ToLower(string(r.Body))
	for _, s := range internals {
		if strings.Contains(body, s) {
			t.Errorf("%s: response to a student leaks %q: %s", what, s, r.Body)
		}
	}
}
