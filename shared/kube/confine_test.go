package kube

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"labkeep/infra"
	"labkeep/shared/labs"
)

// A workspace Pod definition (LABKEEP_WORKSPACE_POD_FILE) that would give
// the student's root more than the workspace set, or leave it without
// no_new_privs or seccomp, is refused with a sentence naming what is
// wrong; one that asks for fewer capabilities (a platform whose nodes
// cannot grant one) is accepted.
func TestParseWorkspacePodRefusesAnUnconfinedWorkspace(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(sc *corev1.SecurityContext, pod *corev1.PodSpec)
		wantErr string
	}{
		{"the built-in definition", func(*corev1.SecurityContext, *corev1.PodSpec) {}, ""},
		{"fewer capabilities", func(sc *corev1.SecurityContext, _ *corev1.PodSpec) {
			sc.Capabilities.Add = []corev1.Capability{"SETUID", "SETGID", "SYS_CHROOT"}
		}, ""},
		{"seccomp set for the whole Pod", func(sc *corev1.SecurityContext, pod *corev1.PodSpec) {
			pod.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: sc.SeccompProfile}
			sc.SeccompProfile = nil
		}, ""},
		{"no securityContext", func(sc *corev1.SecurityContext, _ *corev1.PodSpec) { *sc = corev1.SecurityContext{} }, "must set allowPrivilegeEscalation: false"},
		{"privilege escalation allowed", func(sc *corev1.SecurityContext, _ *corev1.PodSpec) { sc.AllowPrivilegeEscalation = ptr(true) }, "must set allowPrivilegeEscalation: false"},
		{"privileged", func(sc *corev1.SecurityContext, _ *corev1.PodSpec) { sc.Privileged = ptr(true) }, "must not be privileged"},
		{"no seccomp profile", func(sc *corev1.SecurityContext, _ *corev1.PodSpec) { sc.SeccompProfile = nil }, "seccomp profile"},
		{"seccomp unconfined", func(sc *corev1.SecurityContext, _ *corev1.PodSpec) {
			sc.SeccompProfile.Type = corev1.SeccompProfileTypeUnconfined
		}, "seccomp profile"},
		{"the runtime's default capabilities", func(sc *corev1.SecurityContext, _ *corev1.PodSpec) {
			sc.Capabilities.Drop = []corev1.Capability{"SYS_ADMIN"}
		}, "must drop ALL capabilities"},
		{"NET_RAW for every lab", func(sc *corev1.SecurityContext, _ *corev1.PodSpec) {
			sc.Capabilities.Add = append(sc.Capabilities.Add, "NET_RAW")
		}, "adds capability NET_RAW, outside the workspace set"},
		{"SYS_ADMIN", func(sc *corev1.SecurityContext, _ *corev1.PodSpec) {
			sc.Capabilities.Add = append(sc.Capabilities.Add, "SYS_ADMIN")
		}, "adds capability SYS_ADMIN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var pod corev1.Pod
			if err := yaml.Unmarshal(infra.WorkspacePod(), &pod); err != nil {
				t.Fatal(err)
			}
			tc.edit(pod.Spec.Containers[0].SecurityContext, &pod.Spec)
			data, err := yaml.Marshal(&pod)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ParseWorkspacePod(data)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// A lab that opts in to NET_RAW gets it on its workspace container, on top
// of the workspace set; a lab that does not, does not.
func TestWorkspaceGetsTheLabsOptIns(t *testing.T) {
	cat, err := labs.Parse([]byte(`labs:
- {name: net, kind: pod, image: debian, capabilities: [NET_RAW], nodes: [{role: workspace}]}
- {name: shell, kind: pod, image: debian, nodes: [{role: workspace}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]corev1.Capability{}
	b := testBuilder(t, "shell")
	for _, name := range cat.Names() {
		b.lab, _ = cat.Get(name)
		pod, err := b.workspace(&batchv1.Job{})
		if err != nil {
			t.Fatal(err)
		}
		got[name] = pod.Spec.Containers[0].SecurityContext.Capabilities.Add
	}
	want := map[string][]corev1.Capability{
		"net":   append(append([]corev1.Capability(nil), WorkspaceCapabilities...), "NET_RAW"),
		"shell": WorkspaceCapabilities,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("workspace capabilities by lab (-want +got):\n%s", diff)
	}
	// The definition every session's Pod is copied from is left as it was.
	if diff := cmp.Diff(WorkspaceCapabilities, b.pod.Spec.Containers[0].SecurityContext.Capabilities.Add); diff != "" {
		t.Errorf("the shared definition changed (-want +got):\n%s", diff)
	}
}

// The anchor's Pod needs no privilege at all.
func TestAnchorPodIsUnprivileged(t *testing.T) {
	spec := testBuilder(t, "shell").anchor().Spec.Template.Spec
	got := struct {
		Pod       *corev1.PodSecurityContext
		Container *corev1.SecurityContext
	}{spec.SecurityContext, spec.Containers[0].SecurityContext}
	want := got
	want.Pod = &corev1.PodSecurityContext{RunAsNonRoot: ptr(true), RunAsUser: ptr(int64(65535)),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	want.Container = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr(false), ReadOnlyRootFilesystem: ptr(true),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("anchor Pod security (-want +got):\n%s", diff)
	}
}
