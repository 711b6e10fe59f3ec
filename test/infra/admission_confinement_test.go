package infra_test

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The policy's message for a container with an unmasked /proc or run
// unconfined, as admission-policy.yaml writes it (its start).
const refusedUnconfined = "no container may run with an unmasked /proc (procMount other than Default) or unconfined"

// appArmorAnnotation is the legacy annotation giving container c its
// AppArmor profile, which the API server still turns into the field.
func appArmorAnnotation(c string) string {
	return "container.apparmor.security.beta.kubernetes.io/" + c
}

// No container the functions create, guardian's included, may run with
// an unmasked /proc or unconfined by AppArmor, seccomp or SELinux (what
// the Pod Security baseline level forbids besides the policy's other
// rules). Under admission-policy.yaml on the real API server (rbac.yaml,
// the functions impersonated), copies of labkeep's own workspace Pod,
// anchor Job and VM changed in one way are refused: procMount Unmasked (in
// a Pod with its own user namespace, which the API server asks for it),
// appArmorProfile Unconfined for the workspace, guardian or the whole Pod,
// the legacy AppArmor annotation "unconfined" on a Pod, a Job's template
// or a VM's template (KubeVirt copies it to the virt-launcher Pod),
// seccomp Unconfined for guardian or the whole Pod, an SELinux type
// outside the container types or an SELinux user. The controls pass: a
// user namespace alone, the annotation's runtime/default and a Localhost
// AppArmor profile.
func TestAdmissionRefusesUnconfinedContainers(t *testing.T) {
	f := newShapeFixture(t, "conf", nil)
	vm := f.ownVM(t, "linux-vm")
	type podEdit = func(p *corev1.Pod, ws, guardian *corev1.Container)
	// workspace, guardian and pod edit the workspace's, guardian's and the
	// Pod's security context.
	workspace := func(set func(sc *corev1.SecurityContext)) podEdit {
		return func(_ *corev1.Pod, ws, _ *corev1.Container) { set(ws.SecurityContext) }
	}
	guardian := func(set func(sc *corev1.SecurityContext)) podEdit {
		return func(_ *corev1.Pod, _, g *corev1.Container) { set(g.SecurityContext) }
	}
	pod := func(set func(sc *corev1.PodSecurityContext)) podEdit {
		return func(p *corev1.Pod, _, _ *corev1.Container) {
			if p.Spec.SecurityContext == nil {
				p.Spec.SecurityContext = &corev1.PodSecurityContext{}
			}
			set(p.Spec.SecurityContext)
		}
	}
	unconfined := &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
	seccompUnconfined := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
	annotate := func(value string) podEdit {
		return func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Annotations = map[string]string{appArmorAnnotation("workspace"): value}
		}
	}
	testAdmission(t, f.fnDyn, f.place.Sessions, []admissionCase{
		{"labkeep's own workspace Pod", f.pod(nil), ""},
		{"its own user namespace alone", f.pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.HostUsers = ptr(false)
		}), ""},
		{"an unmasked /proc for the workspace", f.pod(func(p *corev1.Pod, ws, _ *corev1.Container) {
			p.Spec.HostUsers = ptr(false)
			ws.SecurityContext.ProcMount = ptr(corev1.UnmaskedProcMount)
		}), refusedUnconfined},
		{"AppArmor Unconfined for the workspace", f.pod(workspace(func(sc *corev1.SecurityContext) { sc.AppArmorProfile = unconfined })), refusedUnconfined},
		{"AppArmor Unconfined for guardian", f.pod(guardian(func(sc *corev1.SecurityContext) { sc.AppArmorProfile = unconfined })), refusedUnconfined},
		{"AppArmor Unconfined for the whole Pod", f.pod(pod(func(sc *corev1.PodSecurityContext) { sc.AppArmorProfile = unconfined })), refusedUnconfined},
		{"a Localhost AppArmor profile for the workspace", f.pod(workspace(func(sc *corev1.SecurityContext) {
			sc.AppArmorProfile = &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeLocalhost, LocalhostProfile: ptr("labkeep-workspace")}
		})), ""},
		{"the legacy AppArmor annotation unconfined", f.pod(annotate("unconfined")), refusedUnconfined},
		{"the legacy AppArmor annotation runtime/default", f.pod(annotate("runtime/default")), ""},
		{"the anchor Job's Pod unconfined by the legacy annotation", f.ownAnchor(func(j *batchv1.Job) {
			j.Spec.Template.Annotations = map[string]string{appArmorAnnotation("pause"): "unconfined"}
		}), refusedUnconfined},
		{"a VM whose virt-launcher Pod would be unconfined by the legacy annotation", vm(func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "unconfined", "spec", "template", "metadata", "annotations", appArmorAnnotation("compute"))
		}), refusedUnconfined},
		{"seccomp Unconfined for guardian", f.pod(guardian(func(sc *corev1.SecurityContext) { sc.SeccompProfile = seccompUnconfined })), refusedUnconfined},
		{"seccomp Unconfined for the whole Pod", f.pod(pod(func(sc *corev1.PodSecurityContext) { sc.SeccompProfile = seccompUnconfined })), refusedUnconfined},
		{"the SELinux type of a super-privileged container", f.pod(workspace(func(sc *corev1.SecurityContext) {
			sc.SELinuxOptions = &corev1.SELinuxOptions{Type: "spc_t"}
		})), refusedUnconfined},
		{"an SELinux user for the whole Pod", f.pod(pod(func(sc *corev1.PodSecurityContext) {
			sc.SELinuxOptions = &corev1.SELinuxOptions{User: "system_u"}
		})), refusedUnconfined},
	})
}
