package infra_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"labkeep/infra"
	"labkeep/localrun/devserve"
	"labkeep/localrun/images"
	"labkeep/localrun/node"
	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/shared/alerts"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/session"
	"labkeep/shared/workspacekey"
)

// The policy's messages for guardian, Pod fields, Jobs and NetworkPolicies,
// as admission-policy.yaml writes them (their start).
const (
	refusedGuardianEnv    = "guardian's environment must be labkeep's own"
	refusedGuardianMounts = "guardian may mount only its own volumes as labkeep does"
	refusedGuardianProbes = "guardian takes no lifecycle hooks and only labkeep's probes"
	refusedPodFields      = "a Pod must not set nodeName, hostAliases or sysctls"
	refusedJob            = "a Job must be its session's deadline anchor as labkeep builds it"
	refusedNetworkPolicy  = "a NetworkPolicy must be its session's own as labkeep builds it"
)

var netpolGVR = schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}

// shapeFixture is one placement under the admission policy with labkeep's
// own workspace Pod of a shell session (own), made with guardian's webhook
// set, and a second session (other), both provisioned by labkeep's code as
// the functions.
type shapeFixture struct {
	*policyFixture
	own, other session.Session
	node       string
	workspace  corev1.Pod
	anchor     batchv1.Job
}

// newShapeFixture sets up a shapeFixture under the parameters data (nil:
// the file's) and waits for the policy.
func newShapeFixture(t *testing.T, prefix string, data map[string]string) *shapeFixture {
	t.Helper()
	f := &shapeFixture{policyFixture: newPolicyFixture(t, prefix, data, func(cfg *kube.Config) {
		cfg.GuardianWebhookURL = "https://labkeep.example.org/guardianAlert"
	})}
	logTypeWarnings(t, f.admin)
	var shell labs.Lab
	f.own, shell = f.ownSession(t, "shell")
	f.other, _ = f.ownSession(t, "shell")
	f.node = shell.Nodes[0].Name
	typed(t, stored(t, podsGVR, f.place.Sessions, session.NodeName(f.own.ID, f.node)), &f.workspace)
	typed(t, stored(t, jobsGVR, f.place.Sessions, session.AnchorName(f.own.ID)), &f.anchor)
	// The crafted Pods keep the real Pod's name (the policy ties it to
	// the Secret it mounts), so the real one goes.
	removeOwn(t, podsGVR, f.place.Sessions, f.workspace.Name)
	return f
}

// pod makes copies of labkeep's own workspace Pod, keeping its name.
func (f *shapeFixture) pod(edit func(p *corev1.Pod, ws, guardian *corev1.Container)) crafted {
	return podCopies(&f.workspace, f.workspace.Name)(edit)
}

// setEnv sets c's variable name to value, replacing labkeep's own.
func setEnv(c *corev1.Container, name, value string) {
	for i := range c.Env {
		if c.Env[i].Name == name {
			c.Env[i] = corev1.EnvVar{Name: name, Value: value}
			return
		}
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
}

// guardian, under admission-policy.yaml on the real API server (rbac.yaml,
// the functions impersonated), is exactly labkeep's: labkeep's own
// workspace Pod (with guardian's webhook carrying its session's
// credentials) passes, and a copy changed in one way is refused with the
// policy's sentence for guardian's environment (a foreign GUARDIAN_CGROUP,
// GUARDIAN_CGROUP_SUBTREE, cgroup mount, SSH or listen address, a literal
// POD_UID, another session's webhook credentials, an envFrom), its mounts
// (an emptyDir over its binary /ko-app, its state elsewhere or shared with
// the workspace, a subPath of the cgroup tree, a configMap as its state)
// or its probes and hooks (an exec liveness probe, a postStart hook, a
// startup probe sent to another host).
func TestAdmissionKeepsGuardianLabkeeps(t *testing.T) {
	f := newShapeFixture(t, "grd", nil)
	otherWebhook := alerts.Key{Secret: []byte("workspace key"), Env: f.env}.WebhookURL("https://labkeep.example.org/guardianAlert", f.other.ID)
	exec := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "kill -9 -1"}}}}
	testAdmission(t, f.fnDyn, f.place.Sessions, []admissionCase{
		{"labkeep's own workspace Pod", f.pod(nil), ""},
		{"another cgroup for guardian to guard (GUARDIAN_CGROUP)", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			setEnv(g, "GUARDIAN_CGROUP", "/kubepods.slice/kubepods-besteffort.slice")
		}), refusedGuardianEnv},
		{"the whole cgroup tree as guardian's subtree", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			setEnv(g, "GUARDIAN_CGROUP_SUBTREE", "/")
		}), refusedGuardianEnv},
		{"another cgroup mount point", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			setEnv(g, "GUARDIAN_CGROUP_MOUNT", "/host/sys/fs/cgroup/kubepods.slice")
		}), refusedGuardianEnv},
		{"another process's port as sshd's", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			setEnv(g, "GUARDIAN_SSH_ADDR", "127.0.0.1:3333")
		}), refusedGuardianEnv},
		{"guardian's API on the workspace's SSH port", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			setEnv(g, "GUARDIAN_LISTEN", ":22")
		}), refusedGuardianEnv},
		{"another Pod's UID as a literal", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			setEnv(g, "POD_UID", "00000000-0000-0000-0000-000000000000")
		}), refusedGuardianEnv},
		{"another session's webhook credentials", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			setEnv(g, "GUARDIAN_WEBHOOK_URL", otherWebhook)
		}), refusedGuardianEnv},
		{"an envFrom of a ConfigMap", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			g.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: infra.AdmissionConfigMap}}}}
		}), refusedGuardianEnv},
		{"an emptyDir over guardian's binary", f.pod(func(p *corev1.Pod, _, g *corev1.Container) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "ko-app", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
			g.VolumeMounts = append(g.VolumeMounts, corev1.VolumeMount{Name: "ko-app", MountPath: "/ko-app"})
		}), refusedGuardianMounts},
		{"guardian's state at another path", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			for i := range g.VolumeMounts {
				if g.VolumeMounts[i].Name == "guardian-state" {
					g.VolumeMounts[i].MountPath = "/etc/guardian"
				}
			}
		}), refusedGuardianMounts},
		{"a subPath of the cgroup tree", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			for i := range g.VolumeMounts {
				if g.VolumeMounts[i].Name == "host-cgroup" {
					g.VolumeMounts[i].SubPath = "kubepods.slice"
				}
			}
		}), refusedGuardianMounts},
		{"guardian's state mounted in the workspace", f.pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.VolumeMounts = append(ws.VolumeMounts, corev1.VolumeMount{Name: "guardian-state", MountPath: "/var/lib/guardian"})
		}), refusedGuardianMounts},
		{"a ConfigMap as guardian's state", f.pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			for i := range p.Spec.Volumes {
				if p.Spec.Volumes[i].Name == "guardian-state" {
					p.Spec.Volumes[i].VolumeSource = corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: infra.AdmissionConfigMap}}}
				}
			}
		}), refusedGuardianMounts},
		{"an exec liveness probe", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			g.LivenessProbe = exec
		}), refusedGuardianProbes},
		{"a postStart hook", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			g.Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: exec.Exec}}
		}), refusedGuardianProbes},
		{"a startup probe sent to another host", f.pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			g.StartupProbe.HTTPGet.Host = "169.254.169.254"
		}), refusedGuardianProbes},
	})
}

// guardian's image can be pinned per environment: with guardianImages
// naming repository@digest, labkeep's own Pods of that image are created
// for real and a copy running the same repository by tag is refused with
// the policy's sentence for guardian.
func TestAdmissionPinsGuardianImage(t *testing.T) {
	const repo = "ghcr.io/labkeep/guardian"
	pinned := pinnedTo(t, repo)
	f := newPolicyFixture(t, "pin", map[string]string{"guardianImages": pinned}, func(cfg *kube.Config) { cfg.GuardianImage = pinned })
	place, fnDyn := f.place, f.fnDyn
	s, shell := f.ownSession(t, "shell")
	var workspace corev1.Pod
	typed(t, stored(t, podsGVR, place.Sessions, session.NodeName(s.ID, shell.Nodes[0].Name)), &workspace)
	removeOwn(t, podsGVR, place.Sessions, workspace.Name)
	pod := podCopies(&workspace, workspace.Name)
	testAdmission(t, fnDyn, place.Sessions, []admissionCase{
		{"guardian pinned by digest", pod(nil), ""},
		{"guardian of the pinned repository by tag", pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			g.Image = repo + ":latest"
		}), refusedGuardian},
		{"guardian of the pinned repository by another digest", pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			g.Image = repo + "@sha256:" + strings.Repeat("f", 64)
		}), refusedGuardian},
	})
}

// The Pod fields labkeep never sets are refused on a copy of labkeep's own
// workspace Pod (nodeName, hostAliases, sysctls) and on a copy of its
// anchor Job's Pod (nodeName); a runtime class and a toleration pass only
// when the parameters name them (a platform's own workspace Pod
// definition), and the API server's own NoExecute tolerations always.
func TestAdmissionRefusesPodFieldsLabkeepNeverSets(t *testing.T) {
	suffix := stacktest.Suffix()
	allowedRC, otherRC := "lk-allowed-"+suffix, "lk-other-"+suffix
	const allowedTaint = "labkeep.example.org/lab-nodes"
	f := newShapeFixture(t, "fld", map[string]string{"runtimeClasses": allowedRC, "tolerations": allowedTaint})
	ctx := context.Background()
	admin := kubeAdmin(t)
	for _, name := range []string{allowedRC, otherRC} {
		if _, err := admin.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: "runc"}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.NodeV1().RuntimeClasses().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
	tolerate := func(key string) func(p *corev1.Pod, _, _ *corev1.Container) {
		return func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists})
		}
	}
	anchor := jobCopies(&f.anchor, f.own.ID)
	testAdmission(t, f.fnDyn, f.place.Sessions, []admissionCase{
		{"a node chosen past the scheduler", f.pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.NodeName = "control-plane-1"
		}), refusedPodFields},
		{"host names of the function's choosing", f.pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.HostAliases = []corev1.HostAlias{{IP: "10.0.0.1", Hostnames: []string{"labkeep.example.org"}}}
		}), refusedPodFields},
		{"kernel parameters", f.pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}}}
		}), refusedPodFields},
		{"a runtime class the parameters do not name", f.pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.RuntimeClassName = &otherRC
		}), refusedPodFields},
		{"a toleration the parameters do not name", f.pod(tolerate("node-role.kubernetes.io/control-plane")), refusedPodFields},
		{"a toleration of every taint", f.pod(tolerate("")), refusedPodFields},
		{"a runtime class the parameters name", f.pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.RuntimeClassName = &allowedRC
		}), ""},
		{"a toleration the parameters name", f.pod(tolerate(allowedTaint)), ""},
		{"an anchor Job's Pod on a node chosen past the scheduler", anchor(func(spec *corev1.PodSpec) {
			spec.NodeName = "control-plane-1"
		}), refusedPodFields},
	})
}

// A Job is exactly a session's deadline anchor: a copy of labkeep's own
// anchor passes the policy (and finds its name taken); a Job labelled with
// another session and node that mounts that node's cloud-init Secret is
// refused, named for that session's anchor or not, and so is an anchor
// with a command, a second container, environment, its session's labels
// on its Pod (its NetworkPolicy would select it), a node label, or
// another name.
func TestAdmissionAllowsOnlyAnchorJobs(t *testing.T) {
	f := newShapeFixture(t, "job", nil)
	victimCloudInit := session.CloudInitName(f.other.ID, f.node)
	job := jobCopies(&f.anchor, f.own.ID)
	// named is a copy of the anchor named name with labels edited by
	// relabel and its Pod spec by edit.
	named := func(name string, relabel func(l map[string]string), edit func(j *batchv1.Job)) crafted {
		c := job(func(*corev1.PodSpec) {})
		j := c.obj.(*batchv1.Job)
		j.Name, j.Labels = name, maps.Clone(j.Labels)
		if relabel != nil {
			relabel(j.Labels)
		}
		if edit != nil {
			edit(j)
		}
		return c
	}
	own := session.AnchorName(f.own.ID)
	victim := func(l map[string]string) {
		l[kube.LabelSession], l[kube.LabelNode] = f.other.ID, f.node
	}
	mountVictim := func(j *batchv1.Job) {
		j.Spec.Template.Labels = map[string]string{kube.LabelAnchorOf: f.other.ID}
		spec := &j.Spec.Template.Spec
		spec.Volumes = []corev1.Volume{{Name: "labkeep", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: victimCloudInit}}}}
		spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "labkeep", MountPath: "/etc/labkeep", ReadOnly: true}}
	}
	testAdmission(t, f.fnDyn, f.place.Sessions, []admissionCase{
		{"labkeep's own anchor", named(own, nil, nil), nameTaken},
		{"another session's node's cloud-init Secret under another name", named("crafted", victim, mountVictim), refusedJob},
		{"another session's node's cloud-init Secret as that session's anchor", named(session.AnchorName(f.other.ID), victim, mountVictim), refusedJob},
		{"an anchor running a command", named(own, nil, func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].Command = []string{"/pause"}
		}), refusedJob},
		{"an anchor with a second container", named(own, nil, func(j *batchv1.Job) {
			c := j.Spec.Template.Spec.Containers[0]
			c.Name = "second"
			j.Spec.Template.Spec.Containers = append(j.Spec.Template.Spec.Containers, c)
		}), refusedJob},
		{"an anchor with environment", named(own, nil, func(j *batchv1.Job) {
			j.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "b"}}
		}), refusedJob},
		{"an anchor whose Pod carries its session's labels", named(own, nil, func(j *batchv1.Job) {
			j.Spec.Template.Labels = map[string]string{kube.LabelAnchorOf: f.own.ID, kube.LabelSession: f.own.ID, kube.LabelEnv: f.env}
		}), refusedJob},
		{"an anchor with a node label", named(own, func(l map[string]string) { l[kube.LabelNode] = f.node }, nil), refusedJob},
		{"an anchor under another name", named("crafted", nil, nil), refusedJob},
	})
}

// A NetworkPolicy is exactly a session's own: labkeep's own policies for a
// Pod lab (guardian's API from the platform, its webhook at an address)
// and a multi-node VM lab (its nodes to each other) are created for real;
// a copy of one passes the policy (and finds its name taken); the
// parameters' egressBlocked ranges are the ones labkeep's policy excepts;
// and a copy changed in one way is refused with the policy's sentence: an
// allow-all selecting every Pod (podSelector {}), another session's Pods,
// extra matchExpressions, egress to a blocked range or without its
// exception, DNS to every address, ingress from every Pod of the sessions
// namespace or from anywhere, Ingress only, another name.
func TestAdmissionAllowsOnlyTheSessionsNetworkPolicy(t *testing.T) {
	f := newNetpolFixture(t, "np", nil)
	place, env, fnDyn := f.place, f.env, f.fnDyn
	_, podNP := f.ownNetworkPolicy(t, "shell")
	_, multiNP := f.ownNetworkPolicy(t, "k8s-cluster")
	other, _ := f.ownNetworkPolicy(t, "shell")

	t.Run("the parameters' egressBlocked are what labkeep's policy excepts", func(t *testing.T) {
		var got []string
		for _, r := range podNP.Spec.Egress {
			for _, p := range r.To {
				if p.IPBlock != nil && (p.IPBlock.CIDR == "0.0.0.0/0" || p.IPBlock.CIDR == "::/0") {
					got = append(got, p.IPBlock.Except...)
				}
			}
		}
		want := strings.Fields(admissionParams(t, infra.Placement{}).Data["egressBlocked"])
		slices.Sort(got)
		slices.Sort(want)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("egressBlocked (-want +got):\n%s", diff)
		}
	})

	tcp := corev1.ProtocolTCP
	allPorts := intstr.FromInt32(1)
	lastPort := int32(65535)
	everything := []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &allPorts, EndPort: &lastPort}}
	dns := intstr.FromInt32(53)
	testAdmission(t, fnDyn, place.Sessions, []admissionCase{
		{"labkeep's own policy of a Pod lab", netpolCopy(&podNP, nil), nameTaken},
		{"labkeep's own policy of a multi-node lab", netpolCopy(&multiNP, nil), nameTaken},
		{"an allow-all selecting every Pod", netpolCopy(&podNP, func(s *networkingv1.NetworkPolicySpec) {
			s.PodSelector = metav1.LabelSelector{}
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
		}), refusedNetworkPolicy},
		{"another session's Pods", netpolCopy(&podNP, func(s *networkingv1.NetworkPolicySpec) {
			s.PodSelector.MatchLabels = map[string]string{kube.LabelSession: other.ID, kube.LabelEnv: env}
		}), refusedNetworkPolicy},
		{"its own Pods and more by expression", netpolCopy(&podNP, func(s *networkingv1.NetworkPolicySpec) {
			s.PodSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: kube.LabelEnv, Operator: metav1.LabelSelectorOpExists}}
		}), refusedNetworkPolicy},
		{"egress to a blocked range", netpolCopy(&podNP, func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = append(s.Egress, networkingv1.NetworkPolicyEgressRule{
				To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}}}, Ports: everything})
		}), refusedNetworkPolicy},
		{"egress to every address without a blocked range's exception", netpolCopy(&podNP, func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = append(s.Egress, networkingv1.NetworkPolicyEgressRule{
				To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"169.254.0.0/16"}}}}, Ports: everything})
		}), refusedNetworkPolicy},
		{"DNS to every address", netpolCopy(&podNP, func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = append(s.Egress, networkingv1.NetworkPolicyEgressRule{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: strings.Fields("169.254.0.0/16 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 100.64.0.0/10")}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &dns}}})
		}), refusedNetworkPolicy},
		{"egress to any Pod of any namespace", netpolCopy(&podNP, func(s *networkingv1.NetworkPolicySpec) {
			s.Egress = append(s.Egress, networkingv1.NetworkPolicyEgressRule{
				To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}})
		}), refusedNetworkPolicy},
		{"ingress from every Pod of the sessions namespace", netpolCopy(&podNP, func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = append(s.Ingress, networkingv1.NetworkPolicyIngressRule{
				From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{
					MatchLabels: map[string]string{corev1.LabelMetadataName: place.Sessions}}}},
				Ports: everything[:1]})
		}), refusedNetworkPolicy},
		{"ingress from anywhere on every port", netpolCopy(&podNP, func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = append(s.Ingress, networkingv1.NetworkPolicyIngressRule{})
		}), refusedNetworkPolicy},
		{"Ingress only", netpolCopy(&podNP, func(s *networkingv1.NetworkPolicySpec) {
			s.PolicyTypes, s.Egress = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, nil
		}), refusedNetworkPolicy},
		{"labkeep's policy under another name", func() crafted {
			c := netpolCopy(&podNP, nil)
			c.obj.(*networkingv1.NetworkPolicy).Name = "crafted"
			return c
		}(), refusedNetworkPolicy},
	})
}

// netpolCopy is a copy of np, one of labkeep's own NetworkPolicies as
// stored, keeping its name, labels and owner, whose spec edit changes (nil:
// none).
func netpolCopy(np *networkingv1.NetworkPolicy, edit func(spec *networkingv1.NetworkPolicySpec)) crafted {
	c := np.DeepCopy()
	c.ObjectMeta = metav1.ObjectMeta{Name: np.Name, Labels: np.Labels, OwnerReferences: np.OwnerReferences}
	if edit != nil {
		edit(&c.Spec)
	}
	return crafted{netpolGVR, c}
}

// pinnedTo is repo pinned to a digest (of no real image) as a
// guardianImages or anchorImages entry pins it.
func pinnedTo(t *testing.T, repo string) string {
	t.Helper()
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if !pinnedDigest.MatchString(digest) {
		t.Fatalf("%s is no digest an image entry may pin", digest)
	}
	return repo + "@" + digest
}

// `make run` installs the admission policy production applies
// (devserve.Admission, through infra.ApplyAdmission, which returns once
// the policy is in force): with those parameters, labkeep's own objects as
// the local stack makes them (its workspace Pod definition, guardian and
// anchor images, the local guest disk for VM labs, guardian's webhook at
// the host's address) are created for real, and a privileged workspace or
// a foreign GUARDIAN_CGROUP is refused as production refuses it.
func TestMakeRunAppliesTheAdmissionPolicy(t *testing.T) {
	ctx := context.Background()
	suffix := stacktest.Suffix()
	place := infra.Placement{Functions: "run-fn-" + suffix, Sessions: "run-vms-" + suffix}
	env := "run-" + suffix
	admin := kubeAdmin(t)
	createPlacement(t, admin, place)
	awaitDefaultServiceAccount(t, admin, place.Sessions)
	const webhook = "http://10.88.0.1:34567/guardianAlert" // the host's alert listener
	adm, err := devserve.Admission(env, true, webhook)
	if err != nil {
		t.Fatal(err)
	}
	if err := infra.ApplyAdmission(ctx, api.admin, place, adm); err != nil {
		t.Fatal(err)
	}
	objs, err := infra.AdmissionObjects(place, adm)
	if err != nil {
		t.Fatal(err)
	}
	deleteClusterScopedAtEnd(t, objs)
	definition, _, err := node.WorkspacePod(nil)
	if err != nil {
		t.Fatal(err)
	}
	sample, err := infra.File("labs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	local, err := stack.LocalVMLabs(sample)
	if err != nil {
		t.Fatal(err)
	}
	catalog, err := labs.Parse(local)
	if err != nil {
		t.Fatal(err)
	}
	fnRC := impersonate(place.Functions)
	cfg := kube.DefaultConfig()
	cfg.Namespace, cfg.Env, cfg.MaxLifetime = place.Sessions, env, time.Hour
	cfg.AnchorImage, cfg.GuardianImage, cfg.WorkspacePod = images.Pause, images.Guardian, definition
	cfg.GuardianWebhookURL = webhook
	cfg.WorkspaceKey = workspacekey.Key{Secret: []byte("workspace key"), Env: env}
	cfg.SSHSourceCIDRs = append(cfg.SSHSourceCIDRs, "10.88.0.1/32")
	cfg.PlatformSourceCIDRs = []string{"10.88.0.1/32"}
	cluster, err := kube.NewForConfig(cfg, fnRC)
	if err != nil {
		t.Fatal(err)
	}
	var workspaceName string
	t.Run("labkeep's own objects as the local stack makes them are admitted", func(t *testing.T) {
		for _, lab := range labsOf(catalog) {
			t.Run(lab.Name, func(t *testing.T) {
				s := provisionOwn(t, cluster, studentSession(lab), lab)
				if lab.Kind == labs.KindPod {
					workspaceName = session.NodeName(s.ID, lab.Nodes[0].Name)
				}
			})
		}
	})
	if workspaceName == "" {
		t.Fatal("no Pod lab was provisioned")
	}
	var workspace corev1.Pod
	typed(t, stored(t, podsGVR, place.Sessions, workspaceName), &workspace)
	removeOwn(t, podsGVR, place.Sessions, workspace.Name)
	pod := podCopies(&workspace, workspace.Name)
	testAdmission(t, dynamic.NewForConfigOrDie(fnRC), place.Sessions, []admissionCase{
		{"labkeep's own workspace Pod", pod(nil), ""},
		{"a privileged workspace", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.SecurityContext.Privileged, ws.SecurityContext.AllowPrivilegeEscalation = ptr(true), nil
		}), refusedEscalation},
		{"a foreign GUARDIAN_CGROUP", pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			setEnv(g, "GUARDIAN_CGROUP", "/")
		}), refusedGuardianEnv},
	})
}

// kubeAdmin is the admin's typed client.
func kubeAdmin(t *testing.T) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(api.admin)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
