package main

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in      string
		want    uint64
		wantErr bool
	}{
		{"", 0, false},
		{"4294967296", 4 << 30, false},
		{"256Mi", 256 << 20, false},
		{"4Gi", 4 << 30, false},
		{"1Ki", 1024, false},
		{"-5", 0, true},
		{"1.5Gi", 0, true},
		{"lots", 0, true},
	}
	for _, tt := range tests {
		got, err := parseBytes(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseBytes(%q) = %d,%v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// envKeys lists the environment variables config reads.
func envKeys() map[string]bool {
	keys := map[string]bool{}
	ty := reflect.TypeOf(config{})
	for i := 0; i < ty.NumField(); i++ {
		tag := ty.Field(i).Tag.Get("envconfig")
		keys["GUARDIAN_"+tag] = true
		keys[tag] = true // envconfig falls back to the unprefixed name
	}
	return keys
}

// The Pod spec is what the issue asks for: guardian as a native sidecar
// with exactly its four capabilities, its requests and limits, the shared
// PID namespace, and only environment variables guardian understands.
func TestWorkspacePodSpec(t *testing.T) {
	b, err := os.ReadFile("../../../infra/guardian/workspace-pod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(b, &pod); err != nil {
		t.Fatalf("workspace-pod.yaml is not a valid Pod: %v", err)
	}
	if pod.Spec.ShareProcessNamespace == nil || !*pod.Spec.ShareProcessNamespace {
		t.Error("shareProcessNamespace must be true")
	}
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.InitContainers[0].Name != "guardian" {
		t.Fatalf("want guardian as the only init container, got %d", len(pod.Spec.InitContainers))
	}
	g := pod.Spec.InitContainers[0]
	if g.RestartPolicy == nil || *g.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("guardian must be a native sidecar (restartPolicy: Always)")
	}
	sc := g.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("guardian needs a securityContext with capabilities")
	}
	var add []string
	for _, c := range sc.Capabilities.Add {
		add = append(add, string(c))
	}
	slices.Sort(add)
	if diff := cmp.Diff([]string{"KILL", "SYS_NICE", "SYS_PTRACE", "SYS_RESOURCE"}, add); diff != "" {
		t.Errorf("guardian capabilities (-want +got):\n%s", diff)
	}
	if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("guardian must drop ALL other capabilities, drops %v", sc.Capabilities.Drop)
	}
	want := map[string]map[corev1.ResourceName]string{
		"requests": {corev1.ResourceCPU: "100m", corev1.ResourceMemory: "64Mi"},
		"limits":   {corev1.ResourceCPU: "200m", corev1.ResourceMemory: "128Mi"},
	}
	for kind, list := range map[string]corev1.ResourceList{"requests": g.Resources.Requests, "limits": g.Resources.Limits} {
		for name, q := range want[kind] {
			if got := list[name]; got.Cmp(resource.MustParse(q)) != 0 {
				t.Errorf("guardian %s %s = %s; want %s", kind, name, got.String(), q)
			}
		}
	}
	known := envKeys()
	for _, e := range g.Env {
		if !known[e.Name] {
			t.Errorf("guardian env %s is not a setting guardian reads", e.Name)
		}
	}
	var ws *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == "workspace" {
			ws = &pod.Spec.Containers[i]
		}
	}
	if ws == nil {
		t.Fatal("no workspace container")
	}
	marker := false
	for _, e := range ws.Env {
		marker = marker || (e.Name == "LABKEEP_CONTAINER_NAME" && e.Value == ws.Name)
	}
	if !marker {
		t.Error("the workspace container must carry LABKEEP_CONTAINER_NAME=<its name> for discovery")
	}
	for _, c := range ws.SecurityContext.Capabilities.Add {
		if strings.HasPrefix(string(c), "SYS_") {
			t.Errorf("the workspace must not get %s", c)
		}
	}
}
