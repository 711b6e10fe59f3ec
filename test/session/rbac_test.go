package session_test

import (
	"context"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/infra"
	"labkeep/localrun/stacktest"
)

// The functions run as the ServiceAccount bound by
// infra/base/rbac.yaml — not admin — and that account can do exactly what the
// functions need: create, read and delete, but never update or patch
// (in particular not Secrets), and nothing outside the sessions namespace.
func TestFunctionsRunUnderShippedRBAC(t *testing.T) {
	e := newEnv(t, stacktest.Options{})
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(e.App.Kube) // the config the app really uses
	if err != nil {
		t.Fatal(err)
	}
	who, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantUser := "system:serviceaccount:" + e.FunctionsNamespace + ":" + infra.ServiceAccount
	if who.Status.UserInfo.Username != wantUser {
		t.Fatalf("functions run as %q, want %q", who.Status.UserInfo.Username, wantUser)
	}
	for _, g := range who.Status.UserInfo.Groups {
		if g == "system:masters" {
			t.Fatal("functions run as system:masters")
		}
	}
	tests := []struct {
		name                 string
		ns, group, res, verb string
		want                 bool
	}{
		{"create VMs", e.Namespace, "kubevirt.io", "virtualmachines", "create", true},
		{"list VMs (capacity)", e.Namespace, "kubevirt.io", "virtualmachines", "list", true},
		{"delete VMs", e.Namespace, "kubevirt.io", "virtualmachines", "delete", true},
		{"read VMIs", e.Namespace, "kubevirt.io", "virtualmachineinstances", "get", true},
		{"create Secrets", e.Namespace, "", "secrets", "create", true},
		{"delete Secrets", e.Namespace, "", "secrets", "delete", true},
		{"create anchors", e.Namespace, "batch", "jobs", "create", true},
		{"no patch on Secrets", e.Namespace, "", "secrets", "patch", false},
		{"no update on Secrets", e.Namespace, "", "secrets", "update", false},
		{"no get on single Secrets", e.Namespace, "", "secrets", "get", false},
		{"no patch on VMs", e.Namespace, "kubevirt.io", "virtualmachines", "patch", false},
		{"no update on VMs", e.Namespace, "kubevirt.io", "virtualmachines", "update", false},
		{"no patch on anchors", e.Namespace, "batch", "jobs", "patch", false},
		{"no deletecollection", e.Namespace, "kubevirt.io", "virtualmachines", "deletecollection", false},
		{"no VMI delete", e.Namespace, "kubevirt.io", "virtualmachineinstances", "delete", false},
		{"no roles", e.Namespace, "rbac.authorization.k8s.io", "roles", "create", false},
		{"no quota edits", e.Namespace, "", "resourcequotas", "update", false},
		{"nothing in its own namespace", e.FunctionsNamespace, "kubevirt.io", "virtualmachines", "create", false},
		{"nothing in default", "default", "", "secrets", "list", false},
		{"no namespaces", "", "", "namespaces", "list", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
				Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
					Namespace: tc.ns, Group: tc.group, Resource: tc.res, Verb: tc.verb,
				}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status.Allowed != tc.want {
				t.Errorf("%s %s/%s in %q: allowed=%v, want %v", tc.verb, tc.group, tc.res, tc.ns, r.Status.Allowed, tc.want)
			}
		})
	}
	// And the functions work end to end under it, for every lab kind.
	for _, lab := range []string{"linux-vm", "k8s-cluster", "shell"} {
		student := "rbac-" + lab
		if r := e.Open(student, lab); r.Status != 201 {
			t.Fatalf("open %s = %d %s", lab, r.Status, r.Body)
		}
		if r := e.Close(student); r.Status != 200 {
			t.Fatalf("close %s = %d %s", lab, r.Status, r.Body)
		}
	}
	e.WaitNoObjects()
}
