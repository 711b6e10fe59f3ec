package infra

import (
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

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
		kinds["ResourceQuota"] != 2 || kinds["Service"] != 1 || kinds["CronJob"] != 1 || kinds["NetworkPolicy"] != 1 {
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

// No Role grants any read of Secrets (get, list, watch, or a wildcard):
// a list returns Secret data, and environments may share the sessions
// namespace, so one environment's ServiceAccount could read every other's
// grading tokens. The functions only create and delete cloud-init Secrets
// by name; orphaned ones go with their anchor through the garbage
// collector. guardian's cleanup token is derived, never read: there is no
// exception.
func TestNoRoleReadsSecrets(t *testing.T) {
	objs, err := Objects(Placement{}, "rbac.yaml", "golden-clone-rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var secretVerbs []string
	for _, o := range objs {
		if o.GetKind() != "Role" && o.GetKind() != "ClusterRole" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			rule := r.(map[string]any)
			groups, _, _ := unstructured.NestedStringSlice(rule, "apiGroups")
			resources, _, _ := unstructured.NestedStringSlice(rule, "resources")
			verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
			if !slices.Contains(groups, "") && !slices.Contains(groups, "*") {
				continue
			}
			if !slices.Contains(resources, "secrets") && !slices.Contains(resources, "*") {
				continue
			}
			names, _, _ := unstructured.NestedStringSlice(rule, "resourceNames")
			for _, v := range verbs {
				if v == "get" || v == "list" || v == "watch" || v == "*" {
					t.Errorf("%s %s grants %q on Secrets (resourceNames %v)", o.GetKind(), o.GetName(), v, names)
				}
			}
			if o.GetName() == ServiceAccount {
				secretVerbs = append(secretVerbs, verbs...)
			}
		}
	}
	slices.Sort(secretVerbs)
	if !slices.Equal(secretVerbs, []string{"create", "delete"}) {
		t.Errorf("functions Role verbs on Secrets = %v, want exactly [create delete]", secretVerbs)
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

// notInKustomization are the manifests `kubectl apply -k infra/base/` leaves
// out on purpose, with the reason (also written in base/kustomization.yaml).
var notInKustomization = map[string]string{
	"reap-cronjob.yaml":                   "alternative to reap-pingsource.yaml where Knative Eventing is missing; two schedulers make one fail with 409 busy every minute",
	"golden-clone-rbac.yaml":              "only for golden-PVC labs; needs the labkeep-golden namespace",
	"guardian/workspace-pod.yaml":         "an example; the functions create the real workspace Pods",
	"guardian/tetragon-block-renice.yaml": "needs Tetragon's CRDs",
}

// Every manifest is deployed by kustomization.yaml or left out on
// purpose (notInKustomization); a new manifest must be one or the other.
func TestKustomizationListsEveryManifest(t *testing.T) {
	data, err := File("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources          []string `json:"resources"`
		ConfigMapGenerator []struct {
			Files []string `json:"files"`
		} `json:"configMapGenerator"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	used := map[string]string{"kustomization.yaml": "itself"}
	for _, r := range k.Resources {
		used[r] = "resources"
	}
	for _, g := range k.ConfigMapGenerator {
		for _, f := range g.Files {
			used[f] = "configMapGenerator"
		}
	}
	manifests, err := fs.Glob(files, "*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	guardian, err := filepath.Glob("guardian/*.yaml") // not embedded
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range guardian {
		if !strings.HasPrefix(filepath.Base(g), ".") { // guardian/.ko.yaml is ko's config
			manifests = append(manifests, g)
		}
	}
	for _, m := range manifests {
		_, listed := used[m]
		reason, excluded := notInKustomization[m]
		switch {
		case listed && excluded:
			t.Errorf("%s is listed in kustomization.yaml (%s) but also excluded on purpose (%s)", m, used[m], reason)
		case !listed && !excluded:
			t.Errorf("%s is neither in kustomization.yaml nor in notInKustomization with a reason", m)
		}
	}
	for name := range used {
		if !slices.Contains(manifests, name) {
			t.Errorf("kustomization.yaml names %s, which is not a manifest of infra/", name)
		}
	}
	for name := range notInKustomization {
		if !slices.Contains(manifests, name) {
			t.Errorf("notInKustomization names %s, which is not a manifest of infra/", name)
		}
		if !strings.Contains(string(data), strings.TrimPrefix(name, "guardian/")) {
			t.Errorf("kustomization.yaml's header does not explain why %s is left out", name)
		}
	}
}

// The admission policy placed for other namespaces selects and reads its
// parameters from the renamed sessions namespace, under a binding name of
// its own, and its ConfigMap names the environment for the renamed
// functions namespace alone, with the extra images after the file's.
func TestAdmissionObjectsArePlaced(t *testing.T) {
	objs, err := AdmissionObjects(Placement{Functions: "fn", Sessions: "vms"}, Admission{Env: "dev", Images: []string{"local.example/disks/"}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, o := range objs {
		switch o.GetKind() {
		case "ValidatingAdmissionPolicyBinding":
			sel, _, _ := unstructured.NestedString(o.Object, "spec", "matchResources", "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name")
			param, _, _ := unstructured.NestedString(o.Object, "spec", "paramRef", "namespace")
			got["binding "+o.GetName()] = sel + " " + param
		case "ConfigMap":
			data, _, _ := unstructured.NestedStringMap(o.Object, "data")
			for k, v := range data {
				if strings.HasPrefix(k, "env.") {
					got[k] = v
				}
			}
			images := strings.Fields(data["images"])
			got["last image"] = images[len(images)-1]
			got["ConfigMap namespace"] = o.GetNamespace()
		}
	}
	want := map[string]string{
		"binding labkeep-functions-vms":        "vms vms",
		"binding labkeep-functions-exec-vms":   "vms ",
		"binding labkeep-functions-delete-vms": "vms vms",
		"env.fn":                               "dev",
		"last image":                           "local.example/disks/",
		"ConfigMap namespace":                  "vms",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("placed admission objects (-want +got):\n%s", diff)
	}
}
