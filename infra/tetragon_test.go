package infra_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// tracingPolicy is the part of Tetragon's TracingPolicy the renice policy
// relies on (Tetragon's CRDs and Go types are not a dependency here).
type tracingPolicy struct {
	Kind string `json:"kind"`
	Spec struct {
		PodSelector       *metav1.LabelSelector `json:"podSelector"`
		ContainerSelector *metav1.LabelSelector `json:"containerSelector"`
		Kprobes           []struct {
			Call      string `json:"call"`
			Selectors []struct {
				MatchBinaries []any `json:"matchBinaries"`
				MatchActions  []struct {
					Action string `json:"action"`
				} `json:"matchActions"`
			} `json:"selectors"`
		} `json:"kprobes"`
	} `json:"spec"`
}

// provisionedWorkspace is the workspace Pod labkeep's Kubernetes adapter
// creates for a Pod lab, from the default definition.
func provisionedWorkspace(t *testing.T) (map[string]string, []string) {
	t.Helper()
	cat, err := labs.Parse([]byte(`labs: [{name: shell, kind: pod, image: debian, nodes: [{role: workspace}], sshPort: 2222}]`))
	if err != nil {
		t.Fatal(err)
	}
	lab, _ := cat.Get("shell")
	cfg := kube.DefaultConfig()
	cfg.Env, cfg.MaxLifetime = "dev", time.Hour
	client := fake.NewSimpleClientset()
	c, err := kube.New(cfg, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := session.Session{ID: "0b3c6a4e-1f6f-4a50-9d7e-2f3b7d1c9a11", Student: "alice@example.org", GradingToken: "tok"}
	if err := c.Provision(context.Background(), s, lab); err != nil {
		t.Fatal(err)
	}
	pods, err := client.CoreV1().Pods(cfg.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("workspace Pods created: %v, %v; want one", pods, err)
	}
	pod := pods.Items[0]
	var names []string
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		names = append(names, c.Name)
	}
	return pod.Labels, names
}

// The renice policy applies to the workspace Pods labkeep really creates,
// to every container in them but guardian's, and exempts guardian by its
// container, never by a binary path the workspace's root could recreate.
func TestTetragonRenicePolicySelectsWorkspacePods(t *testing.T) {
	raw, err := os.ReadFile("guardian/tetragon-block-renice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var p tracingPolicy
	if err := yaml.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	if p.Kind != "TracingPolicy" || p.Spec.PodSelector == nil || p.Spec.ContainerSelector == nil {
		t.Fatalf("kind %q, podSelector %v, containerSelector %v; want a TracingPolicy with both selectors", p.Kind, p.Spec.PodSelector, p.Spec.ContainerSelector)
	}
	podLabels, containers := provisionedWorkspace(t)
	pods, err := metav1.LabelSelectorAsSelector(p.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	if !pods.Matches(labels.Set(podLabels)) {
		t.Errorf("podSelector %q does not match the labels of a provisioned workspace Pod %v", pods, podLabels)
	}
	// The builder's labels alone (a VM lab's launcher Pod has these) are
	// not a workspace Pod.
	builderOnly := labels.Set{}
	for k, v := range podLabels {
		if strings.HasPrefix(k, "labkeep.io/") || k == "app.kubernetes.io/managed-by" {
			builderOnly[k] = v
		}
	}
	if pods.Matches(builderOnly) {
		t.Errorf("podSelector %q matches any labkeep Pod (%v), VM launchers included", pods, builderOnly)
	}

	ctrs, err := metav1.LabelSelectorAsSelector(p.Spec.ContainerSelector)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range containers {
		if got, want := ctrs.Matches(labels.Set{"name": name}), name != "guardian"; got != want {
			t.Errorf("containerSelector %q matches container %q: %v; want %v", ctrs, name, got, want)
		}
	}
	if !strings.Contains(strings.Join(containers, " "), "guardian") {
		t.Errorf("the provisioned workspace Pod has no guardian container: %v", containers)
	}

	if len(p.Spec.Kprobes) == 0 {
		t.Fatal("no kprobes")
	}
	for _, k := range p.Spec.Kprobes {
		for _, s := range k.Selectors {
			if len(s.MatchBinaries) > 0 {
				t.Errorf("%s: a matchBinaries selector %v; guardian must be exempted by its container, not by a path", k.Call, s.MatchBinaries)
			}
			if len(s.MatchActions) != 1 || s.MatchActions[0].Action != "Override" {
				t.Errorf("%s: actions %+v; want one Override (the call fails with EPERM)", k.Call, s.MatchActions)
			}
		}
	}
	if strings.Contains(string(raw), "/ko-app/") {
		t.Error("the policy still names guardian's binary path")
	}
}
