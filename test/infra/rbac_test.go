package infra_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"labkeep/infra"
)

// rbac.yaml, applied for real and asked through SubjectAccessReviews (the
// API server's own RBAC authorizer): the functions' ServiceAccount cannot
// read Secrets in the sessions namespace in any way — a list would return
// every environment's grading tokens and cloud-init — yet can do all the
// session functions and the reaper do: create and delete cloud-init
// Secrets by name, and list the six kinds the reaper's inventory reads.
// The web terminal adds exactly: exec into Pods and a VMI's serial
// console (guardian's cleanup token is derived, never read).
func TestFunctionsCannotReadSecrets(t *testing.T) {
	ctx := context.Background()
	suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1_000_000_000)
	place := infra.Placement{Functions: "rbac-fn-" + suffix, Sessions: "rbac-vms-" + suffix}
	nsRes := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	for _, ns := range []string{place.Functions, place.Sessions} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind("Namespace")
		u.SetName(ns)
		if err := api.apply(ctx, u, "", false); err != nil {
			t.Fatalf("namespace %s: %v", ns, err)
		}
		t.Cleanup(func() { _ = api.dyn.Resource(nsRes).Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	}
	applyInfra(t, place, "rbac.yaml")
	user := "system:serviceaccount:" + place.Functions + ":" + infra.ServiceAccount
	sar := schema.GroupVersionResource{Group: "authorization.k8s.io", Version: "v1", Resource: "subjectaccessreviews"}
	// allowed asks for verb on resource, written resource[/subresource][@name].
	allowed := func(t *testing.T, group, resource, verb string) bool {
		t.Helper()
		resource, name, _ := strings.Cut(resource, "@")
		resource, sub, _ := strings.Cut(resource, "/")
		review := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
			"spec": map[string]any{
				"user":   user,
				"groups": []any{"system:serviceaccounts", "system:serviceaccounts:" + place.Functions, "system:authenticated"},
				"resourceAttributes": map[string]any{
					"namespace": place.Sessions, "group": group, "resource": resource, "verb": verb,
					"subresource": sub, "name": name,
				},
			},
		}}
		got, err := api.dyn.Resource(sar).Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ok, _, _ := unstructured.NestedBool(got.Object, "status", "allowed")
		return ok
	}
	tests := []struct {
		name                  string
		group, resource, verb string
		want                  bool
	}{
		{"no list of Secrets", "", "secrets", "list", false},
		{"no watch of Secrets", "", "secrets", "watch", false},
		{"no get of a Secret", "", "secrets", "get", false},
		{"no update of a Secret", "", "secrets", "update", false},
		{"no patch of a Secret", "", "secrets", "patch", false},
		{"no deletecollection of Secrets", "", "secrets", "deletecollection", false},
		{"creates cloud-init Secrets", "", "secrets", "create", true},
		{"deletes cloud-init Secrets by name", "", "secrets", "delete", true},
		{"inventory lists VMs", "kubevirt.io", "virtualmachines", "list", true},
		{"inventory lists VMIs", "kubevirt.io", "virtualmachineinstances", "list", true},
		{"inventory lists anchor Jobs", "batch", "jobs", "list", true},
		{"inventory lists Services", "", "services", "list", true},
		{"inventory lists NetworkPolicies", "networking.k8s.io", "networkpolicies", "list", true},
		{"inventory lists Pods", "", "pods", "list", true},
		{"deletes anchors (the GC takes their Secrets)", "batch", "jobs", "delete", true},
		{"no get of a session's Secret by name (cleanup tokens are derived)", "", "secrets@lk-x-a-cloudinit", "get", false},
		{"no get of the old shared cleanup-token Secret", "", "secrets@labkeep-guardian", "get", false},
		{"web terminal execs into workspace containers (SPDY)", "", "pods/exec", "create", true},
		{"web terminal execs into workspace containers (WebSocket)", "", "pods/exec", "get", true},
		{"no attach to a Pod's main process", "", "pods/attach", "create", false},
		{"no proxy into Pods", "", "pods/proxy", "create", false},
		{"web terminal opens a VMI's serial console", "subresources.kubevirt.io", "virtualmachineinstances/console", "get", true},
		{"no VNC into a VMI", "subresources.kubevirt.io", "virtualmachineinstances/vnc", "get", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := allowed(t, tc.group, tc.resource, tc.verb); got != tc.want {
				t.Errorf("%s may %s %s/%s in %s: %v, want %v", user, tc.verb, tc.group, tc.resource, place.Sessions, got, tc.want)
			}
		})
	}
}
