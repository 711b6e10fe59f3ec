package stacktest

import (
	"context"
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"labkeep/localrun/stack"
	"labkeep/shared/kube"
)

// refuseAnnotation marks the VMs whose delete RefuseVMDeletes refuses.
const refuseAnnotation = "labkeep.test/refuse-delete"

// RefuseVMDeletes makes the real API server refuse to delete the VMs of
// one session of d — a server-side refusal, like RBAC denying that one
// object. A ValidatingAdmissionPolicy refuses DELETE of any VM annotated
// refuseAnnotation, and the session's VMs get the annotation. The returned
// func lifts the refusal by removing the annotation, which takes effect at
// once (deleting a policy takes effect only when the API server's policy
// cache next refreshes).
func (d *Deployment) RefuseVMDeletes(t testing.TB, st *stack.Stack, sessionID string) (lift func()) {
	t.Helper()
	ctx := context.Background()
	vmAPI := d.Dyn.Resource(Resource("VirtualMachine")).Namespace(d.Namespace)
	vms, err := vmAPI.List(ctx, metav1.ListOptions{LabelSelector: kube.LabelSession + "=" + sessionID})
	if err != nil || len(vms.Items) == 0 {
		t.Fatalf("no VM of session %s to guard: %v", sessionID, err)
	}
	annotate := func(value any) {
		for _, vm := range vms.Items {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{refuseAnnotation: value}}})
			if _, err := vmAPI.Patch(ctx, vm.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatalf("annotating VM %s: %v", vm.GetName(), err)
			}
		}
	}
	dryDelete := func() error {
		return vmAPI.Delete(ctx, vms.Items[0].GetName(), metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	}
	annotate("true")
	Refuse(t, st, Refusal{
		Name: "refuse-delete-" + d.Namespace, Namespace: d.Namespace,
		Group: "kubevirt.io", Resource: "virtualmachines", Operations: []admissionv1.OperationType{admissionv1.Delete},
		Expression: `!has(oldObject.metadata.annotations) || !('` + refuseAnnotation + `' in oldObject.metadata.annotations)`,
		Message:    "injected fault: deleting this VM is refused",
		Probe:      dryDelete,
	})
	return func() {
		annotate(nil) // a merge patch with null removes the annotation
		// Not found is lifted too: once the reaper has deleted the anchor,
		// the garbage collector retries the VM's delete and may get there
		// first.
		if err := dryDelete(); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete still refused after lifting: %v", err)
		}
	}
}
