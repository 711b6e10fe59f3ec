package infra_test

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"

	"labkeep/shared/session"
)

// The policy's message for a probe or hook naming a host, as
// admission-policy.yaml writes it (its start).
const refusedProbeHost = "no probe or lifecycle hook may name a host"

// ownVM provisions, with labkeep's own code as the functions, a session of
// the sample lab named lab (a VM lab) and makes copies of its first VM as
// stored, keeping its name (the policy ties a VM's name to its session and
// node): one changed in one way is refused by admission before its name is
// looked at, an unchanged one passes the policy and finds its name taken.
func (f *policyFixture) ownVM(t *testing.T, lab string) func(edit func(u *unstructured.Unstructured)) crafted {
	t.Helper()
	s, vmLab := f.ownSession(t, lab)
	vm := stored(t, vmGVR, f.place.Sessions, session.NodeName(s.ID, vmLab.Nodes[0].Name))
	return vmCopies(vm, vm.GetName())
}

// ownAnchor makes copies of the fixture's own session's anchor Job
// (anchorCopies).
func (f *shapeFixture) ownAnchor(edit func(j *batchv1.Job)) crafted {
	return anchorCopies(&f.anchor, f.own.ID)(edit)
}

// anchorCopies makes crafted Jobs from anchor, labkeep's own anchor Job of
// session id as stored: each a copy as jobCopies makes it but keeping the
// anchor's name (the anchor rule ties it to the session), changed by edit.
func anchorCopies(anchor *batchv1.Job, id string) func(edit func(j *batchv1.Job)) crafted {
	return func(edit func(j *batchv1.Job)) crafted {
		c := jobCopies(anchor, id)(func(*corev1.PodSpec) {})
		j := c.obj.(*batchv1.Job)
		j.Name = anchor.Name
		edit(j)
		return c
	}
}

// setVMField sets the field at path of a VM's template spec.
func setVMField(value any, path ...string) func(u *unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, value, append([]string{"spec", "template", "spec"}, path...)...)
	}
}

// No probe or lifecycle hook of what the functions create may name a host:
// the kubelet runs httpGet and tcpSocket handlers from the node's network,
// so a host would have the node connect to the cloud metadata service,
// the API server or another namespace's Pods, past every NetworkPolicy
// (KubeVirt hands a VM's probes to its virt-launcher Pod as they are).
// Under admission-policy.yaml on the real API server (rbac.yaml, the
// functions impersonated), copies of labkeep's own workspace Pod, VM and
// anchor Job with a host in one handler are refused: the workspace's
// probes and hooks, a sidecar added next to guardian, a VM's readiness and
// liveness probes, and the anchor Job's Pod (by the anchor rule, which
// admits no probe at all). An exec probe in the workspace passes: it runs
// inside the container with the container's own privileges, which the
// other rules bound.
func TestAdmissionRefusesProbeHosts(t *testing.T) {
	f := newShapeFixture(t, "phost", nil)
	vm := f.ownVM(t, "linux-vm")
	const metadata, apiServer = "169.254.169.254", "10.96.0.1"
	toHost := func(host string, port int32) *corev1.HTTPGetAction {
		return &corev1.HTTPGetAction{Host: host, Port: intstr.FromInt32(port), Path: "/"}
	}
	probe := func(h corev1.ProbeHandler) *corev1.Probe { return &corev1.Probe{ProbeHandler: h} }
	testAdmission(t, f.fnDyn, f.place.Sessions, []admissionCase{
		{"labkeep's own workspace Pod", f.pod(nil), ""},
		{"the workspace's readiness probe connecting to the metadata service", f.pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.ReadinessProbe.TCPSocket.Host = metadata
		}), refusedProbeHost},
		{"a workspace liveness probe GETting the API server", f.pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.LivenessProbe = probe(corev1.ProbeHandler{HTTPGet: toHost(apiServer, 443)})
		}), refusedProbeHost},
		{"a workspace startup probe connecting to another host", f.pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.StartupProbe = probe(corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Host: apiServer, Port: intstr.FromInt32(6443)}})
		}), refusedProbeHost},
		{"a workspace postStart hook GETting the metadata service", f.pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{HTTPGet: toHost(metadata, 80)}}
		}), refusedProbeHost},
		{"a workspace preStop hook GETting another host", f.pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{HTTPGet: toHost(apiServer, 443)}}
		}), refusedProbeHost},
		{"a sidecar next to guardian probing the metadata service", f.pod(func(p *corev1.Pod, ws, _ *corev1.Container) {
			always := corev1.ContainerRestartPolicyAlways
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{
				Name: "sidecar", Image: ws.Image, RestartPolicy: &always, SecurityContext: ws.SecurityContext.DeepCopy(),
				StartupProbe: probe(corev1.ProbeHandler{HTTPGet: toHost(metadata, 80)}),
			})
		}), refusedProbeHost},
		{"an exec readiness probe in the workspace", f.pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.ReadinessProbe = probe(corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}})
		}), ""},
		{"labkeep's own VM", vm(nil), nameTaken},
		{"a VM's readiness probe connecting to the API server", vm(setVMField(apiServer, "readinessProbe", "tcpSocket", "host")), refusedProbeHost},
		{"a VM's liveness probe GETting the metadata service", vm(setVMField(map[string]any{
			"httpGet": map[string]any{"host": metadata, "port": int64(80), "path": "/"},
		}, "livenessProbe")), refusedProbeHost},
		{"the anchor Job's Pod probing another host", f.ownAnchor(func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].ReadinessProbe = probe(corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Host: apiServer, Port: intstr.FromInt32(443)}})
		}), refusedJob},
	})
}
