// Package openapi_test checks shared/httpapi/openapi.yaml against the real
// handlers on the real local stack (the functions wired by app.Build,
// PostgreSQL, the control plane, virtsim): every request the tests send
// and every answer they get passes through a RoundTripper that validates
// both against the description (kin-openapi's openapi3filter), so a
// handler whose answer drifts from the description — a new field, a
// renamed one, another type, an undocumented status or error code — fails
// here. The tests also require every documented operation and status to be
// exercised (or excluded, with the reason). That every route the code
// registers is documented, and that the enums and error codes are the
// code's, shared/httpapi's own tests check without a stack.
package openapi_test

import (
	"testing"
	"time"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/localrun/virtsim"
	"labkeep/shared/kube"
)

var st *stack.Stack

// stuck is the student whose VMs never boot: their session stays
// provisioning.
const stuck = "stuck"

func TestMain(m *testing.M) {
	stacktest.Main(m, &st, stack.Options{VirtSim: virtsim.Options{
		BootDelay: 500 * time.Millisecond,
		Faults: func(vm *kubevirtv1.VirtualMachine) virtsim.Fault {
			return virtsim.Fault{NeverReady: vm.Labels[kube.LabelStudent] == kube.StudentHash(stuck)}
		},
	}})
}
