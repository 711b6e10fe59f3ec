package infra_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"labkeep/infra"
)

// overlayDirs lists the environments of infra/overlays/: every directory whose
// kustomization.yaml is a Kustomization (infra/overlays/env is the Component they
// share).
func overlayDirs(t *testing.T) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(repoRoot, "infra", "overlays", "*", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, m := range matches {
		data, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), "\nkind: Kustomization\n") {
			dirs = append(dirs, filepath.Dir(m))
		}
	}
	if len(dirs) < 2 {
		t.Fatalf("found overlays %v under infra/overlays/, want at least two environments", dirs)
	}
	return dirs
}

// renderOverlay is `kubectl kustomize dir`: exactly what `kubectl apply
// -k` would send.
func renderOverlay(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not in PATH; cannot render the overlays with kustomize:", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectl, "kustomize", dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	objs, err := decodeYAML(out)
	if err != nil {
		t.Fatalf("decoding kustomize output of %s: %v", dir, err)
	}
	return objs
}

// envFacts is what one rendered environment is: what must differ from
// every other environment's, and what must agree within it.
type envFacts struct {
	Env            string // LABKEEP_ENV: every session object's labkeep.io/env label
	LockScope      string // the functions' PostgreSQL locks are keyed by LABKEEP_ENV
	DatabaseSecret string // namespace/name of LABKEEP_DATABASE_URL's Secret
	Functions      string // the functions' namespace
	Sessions       string // LABKEEP_NAMESPACE

	// Within the environment these must agree (checked by consistency).
	SecretRefs      []string // every secretKeyRef, namespace/name
	AdmissionEnv    string   // the labkeep-admission ConfigMap's env.<Functions>
	PlatformNS      string   // LABKEEP_PLATFORM_NAMESPACE
	MaxVMs          string   // LABKEEP_MAX_CONCURRENT_VMS
	QuotaVMs        string   // the quota's count/virtualmachines.kubevirt.io
	MaxPods         string   // LABKEEP_MAX_CONCURRENT_PODS
	QuotaPods       string   // the labkeep-workspaces quota's pods
	SubjectNS       []string // the RoleBindings' subjects' namespaces
	BindingNS       []string // each admission binding's selected and parameters' namespaces
	ForwarderTarget bool     // the forwarder proxies to the functions' own namespace
}

func containerEnv(t *testing.T, o *unstructured.Unstructured, path ...string) []any {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(o.Object, path...)
	if len(containers) == 0 {
		t.Fatalf("%s %s has no containers", o.GetKind(), o.GetName())
	}
	env, _ := containers[0].(map[string]any)["env"].([]any)
	return env
}

func factsOf(t *testing.T, objs []*unstructured.Unstructured) envFacts {
	t.Helper()
	var f envFacts
	var forwarderConf string
	for _, o := range objs {
		switch {
		case o.GetKind() == "Service" && o.GetAPIVersion() == "serving.knative.dev/v1":
			f.Functions = o.GetNamespace()
			for _, e := range containerEnv(t, o, "spec", "template", "spec", "containers") {
				m := e.(map[string]any)
				value, _ := m["value"].(string)
				switch m["name"] {
				case "LABKEEP_ENV":
					f.Env, f.LockScope = value, value
				case "LABKEEP_NAMESPACE":
					f.Sessions = value
				case "LABKEEP_PLATFORM_NAMESPACE":
					f.PlatformNS = value
				case "LABKEEP_MAX_CONCURRENT_VMS":
					f.MaxVMs = value
				case "LABKEEP_MAX_CONCURRENT_PODS":
					f.MaxPods = value
				}
				if name, ok, _ := unstructured.NestedString(m, "valueFrom", "secretKeyRef", "name"); ok {
					ref := o.GetNamespace() + "/" + name
					f.SecretRefs = append(f.SecretRefs, ref)
					if m["name"] == "LABKEEP_DATABASE_URL" {
						f.DatabaseSecret = ref
					}
				}
			}
		case o.GetKind() == "Deployment":
			for _, e := range containerEnv(t, o, "spec", "template", "spec", "containers") {
				if name, ok, _ := unstructured.NestedString(e.(map[string]any), "valueFrom", "secretKeyRef", "name"); ok {
					f.SecretRefs = append(f.SecretRefs, o.GetNamespace()+"/"+name)
				}
			}
		case o.GetKind() == "ValidatingAdmissionPolicyBinding":
			sel, _, _ := unstructured.NestedString(o.Object, "spec", "matchResources", "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name")
			f.BindingNS = append(f.BindingNS, o.GetName()+" selects "+sel)
			if param, ok, _ := unstructured.NestedString(o.Object, "spec", "paramRef", "namespace"); ok {
				f.BindingNS = append(f.BindingNS, o.GetName()+" reads parameters in "+param)
			}
		case o.GetKind() == "ResourceQuota" && o.GetName() == infra.VMQuota:
			f.QuotaVMs, _, _ = unstructured.NestedString(o.Object, "spec", "hard", "count/virtualmachines.kubevirt.io")
		case o.GetKind() == "ResourceQuota" && o.GetName() == infra.PodQuota:
			f.QuotaPods, _, _ = unstructured.NestedString(o.Object, "spec", "hard", "pods")
		case o.GetKind() == "RoleBinding":
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				ns, _ := s.(map[string]any)["namespace"].(string)
				f.SubjectNS = append(f.SubjectNS, ns)
			}
		case o.GetKind() == "ConfigMap" && o.GetName() == "labkeep-reap-forwarder":
			forwarderConf, _, _ = unstructured.NestedString(o.Object, "data", "reap-forwarder.conf.template")
		}
	}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == "labkeep-admission" {
			f.AdmissionEnv, _, _ = unstructured.NestedString(o.Object, "data", "env."+f.Functions)
		}
	}
	f.ForwarderTarget = strings.Contains(forwarderConf, "http://labkeep-functions."+f.Functions+".svc.cluster.local;")
	return f
}

// consistency lists what disagrees within one environment.
func (f envFacts) consistency() []string {
	var bad []string
	if f.Env == "" {
		bad = append(bad, "no LABKEEP_ENV")
	}
	if f.AdmissionEnv != f.Env {
		bad = append(bad, "admission env."+f.Functions+" = "+f.AdmissionEnv+", LABKEEP_ENV = "+f.Env)
	}
	if f.PlatformNS != f.Functions {
		bad = append(bad, "LABKEEP_PLATFORM_NAMESPACE = "+f.PlatformNS+", functions run in "+f.Functions)
	}
	if f.MaxVMs == "" || f.MaxVMs != f.QuotaVMs {
		bad = append(bad, "LABKEEP_MAX_CONCURRENT_VMS = "+f.MaxVMs+", quota = "+f.QuotaVMs)
	}
	if f.MaxPods == "" || f.MaxPods != f.QuotaPods {
		bad = append(bad, "LABKEEP_MAX_CONCURRENT_PODS = "+f.MaxPods+", quota = "+f.QuotaPods)
	}
	for _, ref := range f.SecretRefs {
		if ref != f.DatabaseSecret {
			bad = append(bad, "secret "+ref+" is not "+f.DatabaseSecret)
		}
	}
	for _, ns := range f.SubjectNS {
		if ns != f.Functions {
			bad = append(bad, "RoleBinding subject in "+ns)
		}
	}
	if len(f.BindingNS) == 0 {
		bad = append(bad, "no admission binding")
	}
	for _, b := range f.BindingNS {
		if !strings.HasSuffix(b, " "+f.Sessions) {
			bad = append(bad, "admission binding "+b+", sessions in "+f.Sessions)
		}
	}
	if !f.ForwarderTarget {
		bad = append(bad, "the reap forwarder does not proxy to labkeep-functions."+f.Functions)
	}
	return bad
}

// shared lists what two environments have in common that must be theirs
// alone.
func shared(a, b envFacts) []string {
	var out []string
	for _, c := range []struct{ what, a, b string }{
		{"env label", a.Env, b.Env},
		{"lock scope", a.LockScope, b.LockScope},
		{"database secret", a.DatabaseSecret, b.DatabaseSecret},
		{"functions namespace", a.Functions, b.Functions},
		{"sessions namespace", a.Sessions, b.Sessions},
	} {
		if c.a == c.b {
			out = append(out, c.what)
		}
	}
	return out
}

// Every environment renders, passes a strict server-side dry run (its
// namespaces created for real first) and agrees with itself; the
// local-only labkeep-env ConfigMap is never sent.
func TestOverlaysPassServerSideDryRun(t *testing.T) {
	for _, dir := range overlayDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			objs := renderOverlay(t, dir)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for _, o := range objs {
				if o.GetName() == "labkeep-env" {
					t.Errorf("the local-only ConfigMap labkeep-env is rendered")
				}
				if o.GetKind() == "Namespace" {
					if err := api.apply(ctx, o, "", false); err != nil {
						t.Fatalf("creating namespace %s: %v", o.GetName(), err)
					}
				}
			}
			validated := dryRunAll(t, "kubectl kustomize "+dir, objs)
			if len(validated) != len(objs) {
				t.Errorf("%d of %d rendered objects validated", len(validated), len(objs))
			}
			f := factsOf(t, objs)
			if bad := f.consistency(); len(bad) > 0 {
				t.Errorf("%s disagrees with itself: %v", dir, bad)
			}
			if want := filepath.Base(dir); f.Env != want {
				t.Errorf("infra/overlays/%s renders LABKEEP_ENV %q", want, f.Env)
			}
			t.Logf("%s: %+v", dir, f)
		})
	}
}

// writeOverlay writes a throwaway environment outside the repository:
// the base and the shared component, with env and the caps.
func writeOverlay(t *testing.T, env, maxVMs, maxPods string) string {
	t.Helper()
	dir := t.TempDir()
	rel := func(target string) string { // kustomize refuses absolute paths
		r, err := filepath.Rel(dir, target)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
		"resources: [" + rel(filepath.Join(repoRoot, "infra", "base")) + "]\n" +
		"components: [" + rel(filepath.Join(repoRoot, "infra", "overlays", "env")) + "]\n" +
		"configMapGenerator:\n  - name: labkeep-env\n    literals: [env=" + env + ", maxVMs=" + maxVMs + ", maxPods=" + maxPods + "]\n" +
		"    options: {disableNameSuffixHash: true, annotations: {config.kubernetes.io/local-config: \"true\"}}\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// No two environments share an env label, a database secret, a lock
// scope or a namespace; the check itself is shown to catch an overlay
// copied without changing its env.
func TestOverlaysNeverShareAnEnvironment(t *testing.T) {
	dirs := overlayDirs(t)
	facts := map[string]envFacts{}
	for _, dir := range dirs {
		facts[filepath.Base(dir)] = factsOf(t, renderOverlay(t, dir))
	}
	type pair struct {
		name string
		a, b envFacts
		want []string
	}
	var tests []pair
	for i, a := range dirs {
		for _, b := range dirs[i+1:] {
			an, bn := filepath.Base(a), filepath.Base(b)
			tests = append(tests, pair{an + " and " + bn, facts[an], facts[bn], nil})
		}
	}
	// A deliberately broken pair: a new overlay copied from dev whose env
	// was left at dev (only its VM cap changed) shares everything.
	copied := factsOf(t, renderOverlay(t, writeOverlay(t, "dev", "3", "5")))
	tests = append(tests, pair{"dev and a copy still saying env=dev", facts["dev"], copied,
		[]string{"env label", "lock scope", "database secret", "functions namespace", "sessions namespace"}})
	// And its fix: the copy with its own env shares nothing.
	fixed := factsOf(t, renderOverlay(t, writeOverlay(t, "qa", "3", "5")))
	tests = append(tests, pair{"dev and the copy with env=qa", facts["dev"], fixed, nil})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, shared(tt.a, tt.b)); diff != "" {
				t.Errorf("shared (-want +got):\n%s", diff)
			}
		})
	}
	if !slices.Contains(dirs, filepath.Join(repoRoot, "infra", "overlays", "dev")) {
		t.Fatalf("no infra/overlays/dev overlay among %v", dirs)
	}
}

// The base alone (kubectl apply -k infra/base/) also keeps each cap equal to
// its quota.
func TestBaseCapsEqualQuotas(t *testing.T) {
	f := factsOf(t, renderOverlay(t, filepath.Join(repoRoot, "infra", "base")))
	got := []string{f.MaxVMs, f.MaxPods}
	want := []string{f.QuotaVMs, f.QuotaPods}
	if diff := cmp.Diff(want, got); diff != "" || f.MaxVMs == "" || f.MaxPods == "" {
		t.Errorf("LABKEEP_MAX_CONCURRENT_VMS, _PODS vs their quotas (-quota +setting):\n%s", diff)
	}
}
