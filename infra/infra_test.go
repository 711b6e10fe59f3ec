package infra

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"labkeep/shared/labs"
)

func TestManifestsDecode(t *testing.T) {
	names := []string{"namespaces.yaml", "rbac.yaml", "golden-clone-rbac.yaml", "resourcequota.yaml", "knative-service.yaml", "reap-cronjob.yaml"}
	objs, err := Objects(Placement{Functions: "fn", Sessions: "vms"}, names...)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
		if ns := o.GetNamespace(); ns == FunctionsNamespace || ns == SessionsNamespace {
			t.Errorf("%s %s kept namespace %q after renaming", o.GetKind(), o.GetName(), ns)
		}
	}
	if kinds["Namespace"] != 2 || kinds["Role"] != 2 || kinds["RoleBinding"] != 2 || kinds["ServiceAccount"] != 1 ||
		kinds["ResourceQuota"] != 1 || kinds["Service"] != 1 || kinds["CronJob"] != 1 {
		t.Errorf("kinds = %v", kinds)
	}
}

// The functions' Role never grants update or patch (a created Secret can
// never be rewritten), nor wildcards.
func TestRoleIsCreateReadDeleteOnly(t *testing.T) {
	objs, err := Objects(Placement{}, "rbac.yaml", "golden-clone-rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "Role" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			rule := r.(map[string]any)
			for _, field := range []string{"verbs", "resources", "apiGroups"} {
				vals, _, _ := unstructured.NestedStringSlice(rule, field)
				if slices.Contains(vals, "*") {
					t.Errorf("%s: wildcard in %s", o.GetName(), field)
				}
				if field == "verbs" && (slices.Contains(vals, "update") || slices.Contains(vals, "patch") || slices.Contains(vals, "escalate")) {
					t.Errorf("%s grants %v on %v", o.GetName(), vals, rule["resources"])
				}
			}
		}
	}
	// The subject follows the renamed functions namespace.
	objs, _ = Objects(Placement{Functions: "fn"}, "rbac.yaml")
	for _, o := range objs {
		if o.GetKind() == "RoleBinding" {
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			if ns := subjects[0].(map[string]any)["namespace"]; ns != "fn" {
				t.Errorf("RoleBinding subject namespace = %v, want fn", ns)
			}
		}
	}
}

// The sample labs are valid and have what `make run` promises: a 1-node
// vm lab, a 3-node vm lab and a pod lab.
func TestSampleLabs(t *testing.T) {
	data, err := File("labs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cat, err := labs.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	var shapes []string
	for _, n := range cat.Names() {
		l, _ := cat.Get(n)
		shapes = append(shapes, string(l.Kind)+"/"+string(rune('0'+len(l.Nodes))))
	}
	slices.Sort(shapes)
	if !slices.Equal(shapes, []string{"pod/1", "vm/1", "vm/3"}) {
		t.Errorf("lab shapes = %v", shapes)
	}
}
