package infra_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"labkeep/infra"
)

// nonManifests are the YAML files in infra/base/ that hold no Kubernetes
// objects, with the reason.
var nonManifests = map[string]string{
	"kustomization.yaml": "kustomize's configuration, checked by TestKustomizeRenders",
	"labs.yaml":          "lab catalog data; kustomize turns it into the labkeep-labs ConfigMap, checked by TestKustomizeRenders",
}

// objectsNamespace is where namespace-less manifests (the example
// workspace Pod) are tried: the namespace session objects live in.
const objectsNamespace = infra.SessionsNamespace

// manifestFiles lists every manifest file of infra/base/ and infra/guardian/,
// relative to infra/base/.
func manifestFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"*.yaml", "../guardian/*.yaml"} {
		matches, err := filepath.Glob(filepath.Join(repoRoot, "infra", "base", pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range matches {
			rel, _ := filepath.Rel(filepath.Join(repoRoot, "infra", "base"), m)
			// Dot files are tools' configuration (guardian/.ko.yaml).
			if _, skip := nonManifests[rel]; !skip && !strings.HasPrefix(filepath.Base(rel), ".") {
				files = append(files, rel)
			}
		}
	}
	if len(files) == 0 {
		t.Fatal("no manifests found under infra/")
	}
	return files
}

func loadManifest(t *testing.T, rel string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := decodeFile(filepath.Join(repoRoot, "infra", "base", rel))
	if err != nil {
		t.Fatalf("decoding %s: %v", filepath.Join("infra", "base", rel), err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s holds no objects", filepath.Join("infra", "base", rel))
	}
	return objs
}

// dryRunAll applies objs server-side in dry-run mode and reports each
// rejection; kinds whose API group the server does not serve are logged
// as skipped. It returns the kinds validated.
func dryRunAll(t *testing.T, source string, objs []*unstructured.Unstructured) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var validated []string
	for _, o := range objs {
		what := o.GetAPIVersion() + " " + o.GetKind() + " " + o.GetName()
		err := api.apply(ctx, o, objectsNamespace, true)
		var ns *notServedError
		switch {
		case errors.As(err, &ns):
			t.Logf("%s: SKIPPED %s: %v", source, what, err)
		case err != nil:
			t.Errorf("%s: %s rejected by the API server's dry run: %v", source, what, err)
		default:
			validated = append(validated, o.GetKind())
		}
	}
	return validated
}

// Every object of every manifest passes a strict server-side dry-run
// apply against the real Kubernetes and Knative schemas.
func TestManifestsPassServerSideDryRun(t *testing.T) {
	var validated []string
	for _, rel := range manifestFiles(t) {
		t.Run(rel, func(t *testing.T) {
			validated = append(validated, dryRunAll(t, filepath.Join("infra", "base", rel), loadManifest(t, rel))...)
		})
	}
	// The kinds this test exists for must really have been validated, not
	// skipped or missing.
	for _, kind := range []string{"Service", "PingSource", "CronJob", "Role", "RoleBinding", "ResourceQuota", "Namespace", "Pod", "Deployment"} {
		if !slices.Contains(validated, kind) {
			t.Errorf("no %s was validated (validated: %v)", kind, validated)
		}
	}
	t.Logf("third-party CRDs installed from: %v", crdFiles)
}

// The dry run is a real check: each kind of mistake it exists to catch
// is rejected by the server.
func TestDryRunRejectsBrokenManifests(t *testing.T) {
	set := func(value any, path ...string) func(*unstructured.Unstructured) error {
		return func(u *unstructured.Unstructured) error { return unstructured.SetNestedField(u.Object, value, path...) }
	}
	tests := []struct {
		name    string
		file    string
		kind    string
		mutate  func(*unstructured.Unstructured) error
		wantErr string // a fragment of the server's message
	}{
		{"misspelt field in the Knative Service", "knative-service.yaml", "Service",
			set(int64(50), "spec", "template", "spec", "containerConcurency"), "field not declared in schema"},
		{"wrong type in the Knative Service", "knative-service.yaml", "Service",
			set("fifty", "spec", "template", "spec", "containerConcurrency"), "containerConcurrency"},
		{"unserved Knative apiVersion", "knative-service.yaml", "Service",
			func(u *unstructured.Unstructured) error { u.SetAPIVersion("serving.knative.dev/v2"); return nil }, "serving.knative.dev/v2"},
		{"misspelt field in the PingSource", "reap-pingsource.yaml", "PingSource",
			set("* * * * *", "spec", "schedul"), "field not declared in schema"},
		{"header field PingSource does not have", "reap-pingsource.yaml", "PingSource",
			set(map[string]any{"Authorization": "Bearer x"}, "spec", "sink", "headers"), "field not declared in schema"},
		{"invalid CronJob schedule", "reap-cronjob.yaml", "CronJob",
			set("every minute", "spec", "schedule"), "schedule"},
		{"invalid quota quantity", "resourcequota.yaml", "ResourceQuota",
			set("eight", "spec", "hard", "count/virtualmachines.kubevirt.io"), "quantities must match"},
		{"RBAC rules that are not a list", "rbac.yaml", "Role",
			set("create", "rules"), "rules"},
		{"invalid sidecar restartPolicy", "../guardian/workspace-pod.yaml", "Pod",
			func(u *unstructured.Unstructured) error {
				ics, _, _ := unstructured.NestedSlice(u.Object, "spec", "initContainers")
				ics[0].(map[string]any)["restartPolicy"] = "Sometimes"
				return unstructured.SetNestedSlice(u.Object, ics, "spec", "initContainers")
			}, "restartPolicy"},
		{"misspelt field in the forwarder Deployment", "reap-pingsource.yaml", "Deployment",
			set(int64(1), "spec", "replica"), "field not declared in schema"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var obj *unstructured.Unstructured
			for _, o := range loadManifest(t, tt.file) {
				if o.GetKind() == tt.kind {
					obj = o
					break
				}
			}
			if obj == nil {
				t.Fatalf("%s has no %s", filepath.Join("infra", "base", tt.file), tt.kind)
			}
			if err := tt.mutate(obj); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := api.apply(ctx, obj, objectsNamespace, true)
			var ns *notServedError
			switch {
			case err == nil:
				t.Fatalf("broken %s accepted by the dry run", tt.kind)
			case errors.As(err, &ns):
				t.Fatalf("broken %s skipped instead of rejected: %v", tt.kind, err)
			case !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("rejected for another reason: %v (want a message containing %q)", err, tt.wantErr)
			}
			t.Logf("rejected as expected: %v", err)
		})
	}
}

// `kubectl kustomize infra/base/` renders, and what it renders — exactly what
// `kubectl apply -k infra/base/` would send, generated ConfigMap included —
// passes the dry run.
func TestKustomizeRenders(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not in PATH; cannot render infra/base/ with kustomize:", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectl, "kustomize", filepath.Join(repoRoot, "infra", "base"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize infra/base/: %v\n%s", err, stderr.String())
	}
	rendered, err := decodeYAML(out)
	if err != nil {
		t.Fatalf("decoding kustomize output: %v", err)
	}
	validated := dryRunAll(t, "kubectl kustomize infra/base/", rendered)
	if len(validated) != len(rendered) {
		t.Errorf("%d of %d rendered objects validated", len(validated), len(rendered))
	}

	// The rendered set is exactly the listed files' objects plus the
	// generated labs ConfigMap, which carries labs.yaml unchanged.
	k := readKustomization(t)
	want := map[string]bool{}
	for _, rel := range k.Resources {
		for _, o := range loadManifest(t, rel) {
			want[objectID(o)] = true
		}
	}
	labs, err := os.ReadFile(filepath.Join(repoRoot, "infra", "base", "labs.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var gotLabs bool
	for _, o := range rendered {
		id := objectID(o)
		if o.GetKind() == "ConfigMap" && o.GetName() == "labkeep-labs" {
			data, _, _ := unstructured.NestedString(o.Object, "data", "labs.yaml")
			if data != string(labs) {
				t.Errorf("ConfigMap labkeep-labs does not carry infra/base/labs.yaml unchanged")
			}
			gotLabs = true
			continue
		}
		if !want[id] {
			t.Errorf("kustomize rendered %s, which no listed manifest holds", id)
		}
		delete(want, id)
	}
	for id := range want {
		t.Errorf("kustomize did not render %s", id)
	}
	if !gotLabs {
		t.Error("kustomize did not generate the labkeep-labs ConfigMap")
	}
}

func objectID(o *unstructured.Unstructured) string {
	return o.GetAPIVersion() + " " + o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}
