package infra_test

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"labkeep/functions/app"
)

// secretSettings must come from a Secret, never from a literal value in
// a manifest (they are credentials).
var secretSettings = []string{"LABKEEP_DATABASE_URL", "LABKEEP_JWT_SECRET", "LABKEEP_WORKSPACE_KEY", "LABKEEP_SCHEDULER_TOKEN"}

// optionalSecrets are credentials app.Config may run without (the metrics
// token: /metrics on its own listener needs none) that, where a template
// sets them, come from a secret store too.
var optionalSecrets = []string{"LABKEEP_METRICS_TOKEN"}

// deployRequired are settings app.Config may run without but every shipped
// deploy template must set, non-empty: the aud and iss portal tokens must
// carry, so a token another service mints with the same secret is
// refused.
var deployRequired = []string{"LABKEEP_JWT_AUDIENCE", "LABKEEP_JWT_ISSUER"}

// setting is one variable of app.Config's settings table.
type setting struct {
	Key string // environment variable
	// Required: app.DefaultConfig does not pass Validate for this
	// setting, so a deployment must set it.
	Required bool
}

// appSettings lists app.Config's settings from its table (the one the
// binaries read the environment with). A setting is required if Validate
// names it when run over the defaults, as every binary starts from them.
func appSettings(t *testing.T) []setting {
	t.Helper()
	var missing string
	def := app.DefaultConfig()
	if err := def.Validate(); err != nil {
		missing = err.Error()
	}
	var out []setting
	table := def.Settings()
	for _, v := range table.Vars {
		key := table.Key(v)
		out = append(out, setting{Key: key, Required: strings.Contains(missing, key+":")})
	}
	if len(out) < 5 {
		t.Fatalf("found only %d settings in app.Config's table: %v", len(out), out)
	}
	return out
}

// find returns the object of kind (and name, if not empty) in infra/base/rel.
func find(t *testing.T, rel, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range loadManifest(t, rel) {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			return o
		}
	}
	t.Fatalf("%s has no %s %q", filepath.Join("infra", "base", rel), kind, name)
	return nil
}

// typed converts u (or its field at path) into out.
func typed(t *testing.T, u *unstructured.Unstructured, out any, path ...string) {
	t.Helper()
	obj := u.Object
	if len(path) > 0 {
		m, ok, err := unstructured.NestedMap(u.Object, path...)
		if err != nil || !ok {
			t.Fatalf("%s %s has no %s (%v)", u.GetKind(), u.GetName(), strings.Join(path, "."), err)
		}
		obj = m
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, out); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// functionsPod is the Knative Service's Pod template and its one
// container.
func functionsPod(t *testing.T) (*unstructured.Unstructured, corev1.PodSpec, corev1.Container) {
	t.Helper()
	ksvc := find(t, "knative-service.yaml", "Service", "")
	var spec corev1.PodSpec
	typed(t, ksvc, &spec, "spec", "template", "spec")
	if len(spec.Containers) != 1 {
		t.Fatalf("Knative Service %s has %d containers, want 1", ksvc.GetName(), len(spec.Containers))
	}
	return ksvc, spec, spec.Containers[0]
}

func envByName(env []corev1.EnvVar) map[string]corev1.EnvVar {
	m := map[string]corev1.EnvVar{}
	for _, e := range env {
		m[e.Name] = e
	}
	return m
}

// The Knative Service's environment covers app.Config: every required
// setting is set, credentials come from Secrets, every LABKEEP_* name is
// one app.Config reads, and the values pass app.Config's own parsing and
// validation.
func TestKnativeServiceConfiguresTheFunctions(t *testing.T) {
	settings := appSettings(t)
	_, _, c := functionsPod(t)
	env := envByName(c.Env)
	known := map[string]bool{}
	for _, s := range settings {
		known[s.Key] = true
	}

	t.Run("every required setting is set", func(t *testing.T) {
		var required []string
		for _, s := range settings {
			if s.Required {
				required = append(required, s.Key)
				if _, ok := env[s.Key]; !ok {
					t.Errorf("%s is required by app.Config but knative-service.yaml does not set it", s.Key)
				}
			}
		}
		for _, key := range deployRequired {
			if e, ok := env[key]; !ok || (e.Value == "" && e.ValueFrom == nil) {
				t.Errorf("%s is required of every deploy template but knative-service.yaml does not set it", key)
			}
		}
		// The defaults lack at least the credentials; if nothing reads as
		// required, the check above checked nothing.
		for _, key := range secretSettings {
			if !slices.Contains(required, key) {
				t.Errorf("%s is not required by app.Config.Validate over the defaults (required: %v)", key, required)
			}
		}
	})
	t.Run("credentials come from Secrets", func(t *testing.T) {
		for _, key := range secretSettings {
			if !known[key] {
				t.Errorf("%s is not an app.Config setting any more; update secretSettings", key)
				continue
			}
			e, ok := env[key]
			switch {
			case !ok:
				t.Errorf("knative-service.yaml does not set %s", key)
			case e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil:
				t.Errorf("%s must be a secretKeyRef, got %+v", key, e)
			case e.ValueFrom.SecretKeyRef.Name == "" || e.ValueFrom.SecretKeyRef.Key == "":
				t.Errorf("%s: secretKeyRef without name or key: %+v", key, e.ValueFrom.SecretKeyRef)
			case e.ValueFrom.SecretKeyRef.Optional != nil && *e.ValueFrom.SecretKeyRef.Optional:
				t.Errorf("%s: secretKeyRef must not be optional", key)
			}
		}
	})
	t.Run("every LABKEEP name is a setting, once", func(t *testing.T) {
		seen := map[string]bool{}
		for _, e := range c.Env {
			if seen[e.Name] {
				t.Errorf("%s set twice", e.Name)
			}
			seen[e.Name] = true
			if strings.HasPrefix(e.Name, app.EnvPrefix+"_") && !known[e.Name] {
				t.Errorf("knative-service.yaml sets %s, which app.Config does not read (misspelt or stale?)", e.Name)
			}
		}
	})
	t.Run("values pass app.Config parsing and Validate", func(t *testing.T) {
		// Start from an environment without any LABKEEP_* setting.
		for key := range known {
			t.Setenv(key, "")
			os.Unsetenv(key)
		}
		standIns := map[string]string{
			"LABKEEP_DATABASE_URL":    "postgres://labkeep@db.example/labkeep",
			"LABKEEP_JWT_SECRET":      strings.Repeat("j", 32),
			"LABKEEP_WORKSPACE_KEY":   strings.Repeat("w", 32),
			"LABKEEP_SCHEDULER_TOKEN": strings.Repeat("s", 32),
		}
		for _, e := range c.Env {
			switch {
			case e.ValueFrom == nil:
				os.Setenv(e.Name, e.Value)
			case e.ValueFrom.SecretKeyRef != nil && standIns[e.Name] != "":
				os.Setenv(e.Name, standIns[e.Name])
			default:
				t.Fatalf("%s: no stand-in for %+v; extend this test", e.Name, e.ValueFrom)
			}
		}
		cfg, err := app.FromEnv(os.LookupEnv) // as every binary starts
		if err != nil {
			t.Fatalf("app.FromEnv rejects knative-service.yaml's settings: %v", err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("app.Config.Validate rejects knative-service.yaml's settings: %v", err)
		}
	})
}

// kustomization is the part of infra/base/kustomization.yaml these tests read.
type kustomization struct {
	Resources          []string `json:"resources"`
	ConfigMapGenerator []struct {
		Name      string   `json:"name"`
		Namespace string   `json:"namespace"`
		Files     []string `json:"files"`
	} `json:"configMapGenerator"`
}

func readKustomization(t *testing.T) kustomization {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "infra", "base", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	return k
}

// The manifests name each other consistently: a mismatch here deploys
// cleanly and then fails at run time (a missing ServiceAccount, a quota
// that disagrees with the VM cap, a scheduler posting to nowhere).
func TestManifestsAgree(t *testing.T) {
	ksvc, pod, c := functionsPod(t)
	env := envByName(c.Env)
	ksvcHost := fmt.Sprintf("%s.%s.svc.cluster.local", ksvc.GetName(), ksvc.GetNamespace())
	tokenRef := env["LABKEEP_SCHEDULER_TOKEN"].ValueFrom

	tests := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"functions run as the ServiceAccount rbac.yaml binds", func(t *testing.T) {
			sa := find(t, "rbac.yaml", "ServiceAccount", "")
			if pod.ServiceAccountName != sa.GetName() || ksvc.GetNamespace() != sa.GetNamespace() {
				t.Errorf("Knative Service runs as %s/%s, rbac.yaml defines %s/%s",
					ksvc.GetNamespace(), pod.ServiceAccountName, sa.GetNamespace(), sa.GetName())
			}
			var rb rbacv1.RoleBinding
			typed(t, find(t, "rbac.yaml", "RoleBinding", ""), &rb)
			want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.GetName(), Namespace: sa.GetNamespace()}}
			if diff := cmp.Diff(want, rb.Subjects); diff != "" {
				t.Errorf("RoleBinding subjects (-want +got):\n%s", diff)
			}
		}},
		{"LABKEEP_NAMESPACE is where the Role and the quota are", func(t *testing.T) {
			ns := env["LABKEEP_NAMESPACE"].Value
			role := find(t, "rbac.yaml", "Role", "")
			quota := find(t, "resourcequota.yaml", "ResourceQuota", "")
			if ns != role.GetNamespace() || ns != quota.GetNamespace() {
				t.Errorf("LABKEEP_NAMESPACE=%q, Role in %q, ResourceQuota in %q", ns, role.GetNamespace(), quota.GetNamespace())
			}
		}},
		{"LABKEEP_MAX_CONCURRENT_VMS equals the VM quota", func(t *testing.T) {
			var q corev1.ResourceQuota
			typed(t, find(t, "resourcequota.yaml", "ResourceQuota", ""), &q)
			hard, ok := q.Spec.Hard["count/virtualmachines.kubevirt.io"]
			if !ok {
				t.Fatal("quota has no count/virtualmachines.kubevirt.io")
			}
			if got := env["LABKEEP_MAX_CONCURRENT_VMS"].Value; got != hard.String() {
				t.Errorf("LABKEEP_MAX_CONCURRENT_VMS=%q, quota allows %s VMs", got, hard.String())
			}
		}},
		{"LABKEEP_LABS_FILE is the mounted labs ConfigMap", func(t *testing.T) {
			k := readKustomization(t)
			if len(k.ConfigMapGenerator) != 1 || len(k.ConfigMapGenerator[0].Files) != 1 {
				t.Fatalf("want one generated ConfigMap with one file, got %+v", k.ConfigMapGenerator)
			}
			gen := k.ConfigMapGenerator[0]
			if gen.Namespace != ksvc.GetNamespace() {
				t.Errorf("labs ConfigMap in %q, functions in %q", gen.Namespace, ksvc.GetNamespace())
			}
			var vol *corev1.Volume
			for i := range pod.Volumes {
				if cm := pod.Volumes[i].ConfigMap; cm != nil && cm.Name == gen.Name {
					vol = &pod.Volumes[i]
				}
			}
			if vol == nil {
				t.Fatalf("no volume mounts ConfigMap %s", gen.Name)
			}
			var mount string
			for _, m := range c.VolumeMounts {
				if m.Name == vol.Name {
					mount = m.MountPath
				}
			}
			want := path.Join(mount, path.Base(gen.Files[0]))
			if got := env["LABKEEP_LABS_FILE"].Value; mount == "" || got != want {
				t.Errorf("LABKEEP_LABS_FILE=%q, ConfigMap %s provides %q", got, gen.Name, want)
			}
		}},
		{"LABKEEP_HTTP_ADDR listens on the container port", func(t *testing.T) {
			addr := env["LABKEEP_HTTP_ADDR"].Value
			if len(c.Ports) != 1 || addr != fmt.Sprintf(":%d", c.Ports[0].ContainerPort) {
				t.Errorf("LABKEEP_HTTP_ADDR=%q, container ports %+v", addr, c.Ports)
			}
		}},
		{"CronJob posts to reapTick with the functions' scheduler token", func(t *testing.T) {
			var cj batchv1.CronJob
			typed(t, find(t, "reap-cronjob.yaml", "CronJob", ""), &cj)
			if cj.Spec.Schedule != "* * * * *" {
				t.Errorf("schedule %q, want every minute", cj.Spec.Schedule)
			}
			tc := cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0]
			if diff := cmp.Diff(tokenRef, envByName(tc.Env)["LABKEEP_SCHEDULER_TOKEN"].ValueFrom); diff != "" {
				t.Errorf("token source differs from the functions' (-functions +cronjob):\n%s", diff)
			}
			args := strings.Join(tc.Args, " ")
			for _, want := range []string{"-X POST", "Authorization: Bearer $(LABKEEP_SCHEDULER_TOKEN)", "http://" + ksvcHost + "/reapTick"} {
				if !strings.Contains(args, want) {
					t.Errorf("curl args %q lack %q", args, want)
				}
			}
		}},
		{"PingSource reaches the forwarder, which posts to reapTick with the token", func(t *testing.T) {
			ps := find(t, "reap-pingsource.yaml", "PingSource", "")
			schedule, _, _ := unstructured.NestedString(ps.Object, "spec", "schedule")
			if schedule != "* * * * *" {
				t.Errorf("schedule %q, want every minute", schedule)
			}
			ref, _, _ := unstructured.NestedStringMap(ps.Object, "spec", "sink", "ref")
			uri, _, _ := unstructured.NestedString(ps.Object, "spec", "sink", "uri")
			if ref["apiVersion"] != "v1" || ref["kind"] != "Service" || uri != "/reapTick" {
				t.Fatalf("sink ref %v uri %q, want a v1 Service and /reapTick", ref, uri)
			}
			var svc corev1.Service
			typed(t, find(t, "reap-pingsource.yaml", "Service", ref["name"]), &svc)
			if svc.Namespace != ps.GetNamespace() {
				t.Errorf("forwarder Service in %q, PingSource in %q", svc.Namespace, ps.GetNamespace())
			}
			var dep appsv1.Deployment
			typed(t, find(t, "reap-pingsource.yaml", "Deployment", ""), &dep)
			podLabels := labels.Set(dep.Spec.Template.Labels)
			if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
				t.Errorf("Service selector %v does not select the forwarder Pods %v", svc.Spec.Selector, podLabels)
			}
			fc := dep.Spec.Template.Spec.Containers[0]
			if len(svc.Spec.Ports) != 1 || !containerHasPort(fc, svc.Spec.Ports[0].TargetPort) {
				t.Errorf("Service ports %+v do not reach container ports %+v", svc.Spec.Ports, fc.Ports)
			}
			if diff := cmp.Diff(tokenRef, envByName(fc.Env)["LABKEEP_SCHEDULER_TOKEN"].ValueFrom); diff != "" {
				t.Errorf("token source differs from the functions' (-functions +forwarder):\n%s", diff)
			}
			tmpl := forwarderTemplate(t, dep)
			for _, want := range []string{
				"location = /reapTick {",
				"limit_except POST { deny all; }",
				`proxy_set_header Authorization "Bearer ${LABKEEP_SCHEDULER_TOKEN}";`,
				"proxy_pass http://" + ksvcHost + ";",
			} {
				if !strings.Contains(tmpl, want) {
					t.Errorf("forwarder config lacks %q:\n%s", want, tmpl)
				}
			}
			var np networkingv1.NetworkPolicy
			typed(t, find(t, "reap-pingsource.yaml", "NetworkPolicy", ""), &np)
			if !labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(podLabels) || len(np.Spec.Ingress) == 0 {
				t.Errorf("NetworkPolicy %+v does not confine the forwarder Pods %v", np.Spec, podLabels)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.check)
	}
}

func containerHasPort(c corev1.Container, target intstr.IntOrString) bool {
	return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return (target.Type == intstr.String && p.Name == target.StrVal) || (target.Type == intstr.Int && p.ContainerPort == target.IntVal)
	})
}

// forwarderTemplate returns the nginx config template the forwarder
// Deployment mounts at /etc/nginx/templates (from its ConfigMap).
func forwarderTemplate(t *testing.T, dep appsv1.Deployment) string {
	t.Helper()
	spec := dep.Spec.Template.Spec
	var volName string
	for _, m := range spec.Containers[0].VolumeMounts {
		if m.MountPath == "/etc/nginx/templates" {
			volName = m.Name
		}
	}
	var cmName string
	for _, v := range spec.Volumes {
		if v.Name == volName && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	if cmName == "" {
		t.Fatal("forwarder mounts no ConfigMap at /etc/nginx/templates")
	}
	var cm corev1.ConfigMap
	typed(t, find(t, "reap-pingsource.yaml", "ConfigMap", cmName), &cm)
	if len(cm.Data) != 1 {
		t.Fatalf("ConfigMap %s has %d keys, want one template", cmName, len(cm.Data))
	}
	for key, tmpl := range cm.Data {
		if !strings.HasSuffix(key, ".conf.template") {
			t.Errorf("ConfigMap key %q: the nginx image renders only *.template, into *.conf", key)
		}
		return tmpl
	}
	return ""
}
