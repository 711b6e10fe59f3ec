package kube

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"labkeep/infra"
	"labkeep/shared/labs"
	"labkeep/shared/session"
	"labkeep/shared/workspacekey"
)

// testWorkspaceKey is the builders' workspace key.
var testWorkspaceKey = workspacekey.Key{Secret: []byte("0123456789abcdef0123456789abcdef"), Env: "dev"}

func testBuilder(t *testing.T, lab string) builder {
	t.Helper()
	cat, err := labs.Parse([]byte(`labs:
- {name: cluster, kind: vm, nodes: [{role: control, memory: 2Gi}, {role: worker, count: 2}], disk: {goldenPVC: {name: g, namespace: golden, size: 20Gi}}}
- {name: shell, kind: pod, image: debian, nodes: [{role: workspace}], sshPort: 2222}
- {name: linux, kind: vm, nodes: [{role: vm}], disk: {containerDisk: fedora}}
- {name: shell-home, kind: pod, image: debian, nodes: [{role: workspace}], home: {size: 2Gi, mountPath: /root}}
- {name: cluster-home, kind: vm, nodes: [{role: control}, {role: worker, count: 2}], disk: {containerDisk: fedora}, home: {size: 5Gi, mountPath: /home/student, group: netsec, node: worker-1}}
`))
	if err != nil {
		t.Fatal(err)
	}
	l, _ := cat.Get(lab)
	pod, err := ParseWorkspacePod(nil)
	if err != nil {
		t.Fatal(err)
	}
	return builder{
		pod: pod,
		cfg: func() Config {
			c := DefaultConfig()
			c.Namespace, c.Env, c.MaxLifetime, c.AnchorImage, c.GuardianImage = "ns", "dev", 3*time.Hour, "pause", "guardian"
			c.WorkspaceKey = testWorkspaceKey
			return c
		}(),
		sess: session.Session{ID: "0b3c6a4e-1f6f-4a50-9d7e-2f3b7d1c9a11", Student: "alice@example.org", GradingToken: "tok"},
		lab:  l,
	}
}

func TestObjectsAreLabelledOwnedAndNamedAfterTheSession(t *testing.T) {
	b := testBuilder(t, "cluster")
	anchor := b.anchor()
	if *anchor.Spec.ActiveDeadlineSeconds != 11700 || *anchor.Spec.TTLSecondsAfterFinished != 0 {
		t.Errorf("anchor deadline=%d ttl=%d", *anchor.Spec.ActiveDeadlineSeconds, *anchor.Spec.TTLSecondsAfterFinished)
	}
	if _, ok := anchor.Spec.Template.Labels[LabelEnv]; ok {
		t.Error("the anchor's Pod carries the env label; the reaper would take it for a workspace")
	}
	anchor.UID = "anchor-uid"
	var metas []metav1.ObjectMeta
	for _, n := range b.lab.Nodes {
		s := b.cloudInit(n, anchor)
		if !*s.Immutable || !strings.Contains(s.StringData["userdata"], `"tok"`) {
			t.Errorf("secret %s = %+v", s.Name, s)
		}
		vm := b.vm(n, anchor)
		res := vm.Spec.Template.Spec.Domain.Resources
		if !res.Requests.Memory().Equal(*res.Limits.Memory()) || !res.Requests.Cpu().Equal(*res.Limits.Cpu()) {
			t.Errorf("VM %s requests %v != limits %v", vm.Name, res.Requests, res.Limits)
		}
		if want := resource.MustParse(n.Memory); !vm.Spec.Template.Spec.Domain.Memory.Guest.Equal(want) {
			t.Errorf("VM %s guest memory %v, want %v", vm.Name, vm.Spec.Template.Spec.Domain.Memory.Guest, want)
		}
		if dv := vm.Spec.DataVolumeTemplates; len(dv) != 1 || dv[0].Spec.Source.PVC.Name != "g" {
			t.Errorf("VM %s dataVolumeTemplates = %+v", vm.Name, dv)
		}
		if vm.Spec.Template.Spec.Subdomain != session.NetworkName(b.sess.ID) || vm.Spec.Template.ObjectMeta.Labels[LabelSession] != b.sess.ID {
			t.Errorf("VM %s template = %+v", vm.Name, vm.Spec.Template.ObjectMeta)
		}
		if errs := validation.IsDNS1123Label(vm.Name); len(errs) > 0 {
			t.Errorf("VM name %q: %v", vm.Name, errs)
		}
		metas = append(metas, s.ObjectMeta, vm.ObjectMeta)
	}
	metas = append(metas, b.service(anchor).ObjectMeta, b.networkPolicy(anchor).ObjectMeta)
	for _, m := range metas {
		if !strings.Contains(m.Name, b.sess.ID) {
			t.Errorf("%s does not contain the session id", m.Name)
		}
		if m.Labels[LabelEnv] != "dev" || m.Labels[LabelSession] != b.sess.ID || m.Labels[LabelRole] == "" ||
			m.Labels[LabelStudent] != StudentHash("alice@example.org") || strings.Contains(m.Labels[LabelStudent], "alice") {
			t.Errorf("%s labels = %v", m.Name, m.Labels)
		}
		if len(m.OwnerReferences) != 1 || m.OwnerReferences[0].UID != "anchor-uid" || m.OwnerReferences[0].Kind != "Job" {
			t.Errorf("%s owners = %+v", m.Name, m.OwnerReferences)
		}
	}
}

func TestWorkspacePod(t *testing.T) {
	b := testBuilder(t, "shell")
	anchor := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: session.AnchorName(b.sess.ID), UID: "u"}}
	pod := mustWorkspace(t, b, anchor)
	if *pod.Spec.ActiveDeadlineSeconds != 11700 {
		t.Errorf("activeDeadlineSeconds = %d", *pod.Spec.ActiveDeadlineSeconds)
	}
	if len(pod.Spec.InitContainers) != 1 || len(pod.Spec.Containers) != 1 {
		t.Fatalf("init containers %d, containers %d; want guardian as the one native sidecar", len(pod.Spec.InitContainers), len(pod.Spec.Containers))
	}
	ws, guardian := pod.Spec.Containers[0], pod.Spec.InitContainers[0]
	if ws.Name != "workspace" || ws.Image != "debian" || guardian.Name != "guardian" || guardian.Image != "guardian" {
		t.Errorf("containers %s=%s, %s=%s", ws.Name, ws.Image, guardian.Name, guardian.Image)
	}
	if guardian.RestartPolicy == nil || *guardian.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("guardian is not a native sidecar (restartPolicy Always)")
	}
	if ws.Ports[0].ContainerPort != 2222 || pod.Labels[LabelRole] != "workspace" || !*pod.Spec.ShareProcessNamespace {
		t.Errorf("workspace port %d, role %q, shared PIDs %v", ws.Ports[0].ContainerPort, pod.Labels[LabelRole], *pod.Spec.ShareProcessNamespace)
	}
	env := map[string]string{}
	for _, e := range guardian.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		case e.ValueFrom.ResourceFieldRef != nil:
			env[e.Name] = e.ValueFrom.ResourceFieldRef.ContainerName + "/" + e.ValueFrom.ResourceFieldRef.Resource
		}
	}
	wantEnv := map[string]string{"POD_UID": "metadata.uid", "POD_NAME": "metadata.name", "CONTAINER_NAME": "workspace",
		"GUARDIAN_SSH_ADDR": "127.0.0.1:2222", "GUARDIAN_MEMORY_LIMIT": "workspace/limits.memory", "GUARDIAN_CGROUP_MOUNT": "/host/sys/fs/cgroup"}
	for k, v := range wantEnv {
		if env[k] != v {
			t.Errorf("guardian env %s = %q, want %q", k, env[k], v)
		}
	}
	caps := guardian.SecurityContext.Capabilities
	if !slices.Equal(caps.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(caps.Add, []corev1.Capability{"SYS_PTRACE", "SYS_NICE", "KILL", "SYS_RESOURCE"}) {
		t.Errorf("guardian capabilities = %+v", caps)
	}
	wantSC := &corev1.SecurityContext{
		RunAsUser:                ptr(int64(0)),
		AllowPrivilegeEscalation: ptr(false),
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: WorkspaceCapabilities},
	}
	if diff := cmp.Diff(wantSC, ws.SecurityContext); diff != "" {
		t.Errorf("workspace securityContext (-want +got):\n%s", diff)
	}
	res := ws.Resources
	if !res.Requests.Memory().Equal(*res.Limits.Memory()) || res.Requests.Memory().Cmp(resource.MustParse(labs.DefaultPodMemory)) != 0 {
		t.Errorf("workspace resources = %+v", res)
	}
	if pod.Spec.Volumes[0].VolumeSource.Secret.SecretName != session.CloudInitName(b.sess.ID, "workspace") {
		t.Errorf("volumes = %+v", pod.Spec.Volumes)
	}
}

// The anchor Job survives its Pod: disruptions are ignored, other
// failures retried, a Pod that ends Succeeded (pause exits 0 on SIGTERM)
// replaced; only activeDeadlineSeconds ends it.
func TestAnchorOutlivesItsPod(t *testing.T) {
	b := testBuilder(t, "cluster")
	b.cfg.AnchorBackoffLimit, b.cfg.AnchorCompletions = 9, 40
	spec := b.anchor().Spec
	if *spec.BackoffLimit != 9 || *spec.Completions != 40 || *spec.Parallelism != 1 {
		t.Errorf("backoffLimit %d completions %d parallelism %d, want 9, 40, 1 from Config", *spec.BackoffLimit, *spec.Completions, *spec.Parallelism)
	}
	want := &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
		Action:          batchv1.PodFailurePolicyActionIgnore,
		OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
	}}}
	if diff := cmp.Diff(want, spec.PodFailurePolicy); diff != "" {
		t.Errorf("podFailurePolicy (-want +got):\n%s", diff)
	}
	if spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %s; a podFailurePolicy needs Never", spec.Template.Spec.RestartPolicy)
	}
}

// The deadline is rounded up, never down, and is never 0.
func TestDeadlineSecondsRoundUp(t *testing.T) {
	tests := []struct {
		name         string
		max, grace   time.Duration
		wantDeadline int64
	}{
		{"whole seconds", 3 * time.Hour, 15 * time.Minute, 11700},
		{"a fraction rounds up", 2 * time.Second, 500 * time.Millisecond, 3},
		{"a nanosecond over rounds up", time.Second + time.Nanosecond, 0, 2},
		{"under a second is 1, not 0", 300 * time.Millisecond, 0, 1},
		{"a negative grace is allowed if the sum is positive", 10 * time.Second, -2500 * time.Millisecond, 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := testBuilder(t, "shell")
			b.cfg.MaxLifetime, b.cfg.DeadlineGrace = tc.max, tc.grace
			if got := *b.anchor().Spec.ActiveDeadlineSeconds; got != tc.wantDeadline {
				t.Errorf("anchor activeDeadlineSeconds = %d, want %d", got, tc.wantDeadline)
			}
			if got := *mustWorkspace(t, b, &batchv1.Job{}).Spec.ActiveDeadlineSeconds; got != tc.wantDeadline {
				t.Errorf("workspace activeDeadlineSeconds = %d, want %d", got, tc.wantDeadline)
			}
		})
	}
}

// New accepts the defaults with an environment and a lifetime, and refuses
// settings that would give no deadline, a negative limit or no images.
func TestNewValidatesSettings(t *testing.T) {
	base := DefaultConfig()
	base.Env, base.MaxLifetime = "dev", time.Hour
	if _, err := New(base, nil, nil); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*Config){
		"no env":                 func(c *Config) { c.Env = "" },
		"bad namespace":          func(c *Config) { c.Namespace = "Not_A_Namespace" },
		"zero completions":       func(c *Config) { c.AnchorCompletions = 0 },
		"no anchor image":        func(c *Config) { c.AnchorImage = "" },
		"no call timeout":        func(c *Config) { c.CallTimeout = 0 },
		"no rate limit":          func(c *Config) { c.QPS = 0 },
		"workspace Pod not YAML": func(c *Config) { c.WorkspacePod = []byte("{") },
		"workspace Pod without guardian": func(c *Config) {
			c.WorkspacePod = []byte("kind: Pod\nspec: {containers: [{name: workspace, ports: [{name: ssh, containerPort: 22}]}]}")
		},
		"workspace Pod with a typo": func(c *Config) { c.WorkspacePod = append(infra.WorkspacePod(), "\nspecc: {}\n"...) },
		"no deadline":               func(c *Config) { c.MaxLifetime, c.DeadlineGrace = 0, 0 },
		"negative deadline":         func(c *Config) { c.DeadlineGrace = -2 * time.Hour },
		"negative backoff":          func(c *Config) { c.AnchorBackoffLimit = -1 },
		"negative completions":      func(c *Config) { c.AnchorCompletions = -1 },
		"no SSH source":             func(c *Config) { c.SSHSourceCIDRs = nil },
		"bad platform namespace":    func(c *Config) { c.PlatformNamespace = "Not_A_Namespace" },
		"SSH source not a CIDR":     func(c *Config) { c.SSHSourceCIDRs = []string{"203.0.113.7"} },
		"blocked CIDR with host bits": func(c *Config) {
			c.EgressBlockedCIDRs = []string{"10.1.2.3/8"}
		},
		"platform source not a CIDR":   func(c *Config) { c.PlatformSourceCIDRs = []string{"10.216.0.1"} },
		"cluster DNS without labels":   func(c *Config) { c.ClusterDNS = "kube-system" },
		"cluster DNS, bad namespace":   func(c *Config) { c.ClusterDNS = "Kube_System/k8s-app=kube-dns" },
		"cluster DNS, not key=value":   func(c *Config) { c.ClusterDNS = "kube-system/kube-dns" },
		"cluster DNS, bad label value": func(c *Config) { c.ClusterDNS = "kube-system/k8s-app=kube dns" },
	} {
		cfg := base
		mutate(&cfg)
		if _, err := New(cfg, nil, nil); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}

func TestIsVirtLauncher(t *testing.T) {
	yes := true
	tests := []struct {
		name string
		meta metav1.ObjectMeta
		want bool
	}{
		{"workspace Pod owned by the anchor", metav1.ObjectMeta{Labels: map[string]string{LabelEnv: "dev"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "a"}}}, false},
		{"labelled virt-launcher", metav1.ObjectMeta{Labels: map[string]string{LabelEnv: "dev", "kubevirt.io": "virt-launcher"}}, true},
		{"controlled by a VMI", metav1.ObjectMeta{Labels: map[string]string{LabelEnv: "dev"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: "vm", Controller: &yes}}}, true},
		{"owned but not controlled by a VMI", metav1.ObjectMeta{Labels: map[string]string{LabelEnv: "dev"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: "vm"}}}, false},
		{"another kubevirt.io label value", metav1.ObjectMeta{Labels: map[string]string{"kubevirt.io": "virt-handler"}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsVirtLauncher(tc.meta); got != tc.want {
				t.Errorf("IsVirtLauncher = %v, want %v", got, tc.want)
			}
		})
	}
}

func mustWorkspace(t *testing.T, b builder, anchor *batchv1.Job) *corev1.Pod {
	t.Helper()
	pod, err := b.workspace(anchor)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// The workspace Pod is the one definition in infra/guardian/workspace-pod.yaml
// with only the per-session fields filled in: putting the template's values
// back into those fields gives the template exactly.
func TestWorkspacePodIsTheInfraDefinition(t *testing.T) {
	var tmpl corev1.Pod
	if err := yaml.UnmarshalStrict(infra.WorkspacePod(), &tmpl); err != nil {
		t.Fatal(err)
	}
	b := testBuilder(t, "shell")
	pod := mustWorkspace(t, b, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: "u"}})

	// Undo exactly what workspace fills in per session.
	pod.ObjectMeta = tmpl.ObjectMeta
	pod.Spec.ActiveDeadlineSeconds, pod.Spec.Hostname = tmpl.Spec.ActiveDeadlineSeconds, tmpl.Spec.Hostname
	if pod.Spec.Volumes[0].Name != "labkeep" || pod.Spec.Volumes[0].Secret.SecretName != session.CloudInitName(b.sess.ID, "workspace") {
		t.Fatalf("first volume %+v, want the session's labkeep Secret", pod.Spec.Volumes[0])
	}
	pod.Spec.Volumes = pod.Spec.Volumes[1:]
	g, tg := &pod.Spec.InitContainers[0], tmpl.Spec.InitContainers[0]
	g.Image, g.Env = tg.Image, tg.Env
	w, tw := &pod.Spec.Containers[0], tmpl.Spec.Containers[0]
	for _, c := range []*corev1.Container{g, w} {
		if len(c.VolumeMounts) == 0 || c.VolumeMounts[0].Name != "labkeep" || c.VolumeMounts[0].MountPath != "/etc/labkeep" {
			t.Errorf("%s: first mount %+v, want the session's Secret at /etc/labkeep", c.Name, c.VolumeMounts)
		}
	}
	g.VolumeMounts = g.VolumeMounts[1:]
	w.Image, w.Ports[0].ContainerPort, w.Resources, w.Env = tw.Image, tw.Ports[0].ContainerPort, tw.Resources, tw.Env
	if got := built(t, b).Spec.Containers[0].Env; !hasEnv(got, "LABKEEP_SSH_PORT", "2222") {
		t.Errorf("workspace env %+v, want LABKEEP_SSH_PORT=2222", got)
	}
	if w.VolumeMounts = w.VolumeMounts[1:]; len(w.VolumeMounts) == 0 {
		w.VolumeMounts = tw.VolumeMounts // the template has none of its own
	}
	if diff := cmp.Diff(&tmpl, pod); diff != "" {
		t.Errorf("workspace Pod differs from infra/guardian/workspace-pod.yaml beyond the per-session fields (-template +built):\n%s", diff)
	}
	// The env values filled in are guardian's SSH probe address and the
	// Secret its cleanup token comes from, the session's own.
	built := mustWorkspace(t, b, &batchv1.Job{})
	for i, e := range built.Spec.InitContainers[0].Env {
		want := *tmpl.Spec.InitContainers[0].Env[i].DeepCopy()
		switch e.Name {
		case "GUARDIAN_SSH_ADDR":
			want.Value = "127.0.0.1:2222"
		case "GUARDIAN_CLEANUP_TOKEN":
			want.ValueFrom.SecretKeyRef.Name = session.CloudInitName(b.sess.ID, "workspace")
		}
		if diff := cmp.Diff(want, e); diff != "" {
			t.Errorf("guardian env %d (-want +got):\n%s", i, diff)
		}
	}
}

// Each node gets the session's own credentials: the student's key and the
// platform's keys authorized, the session's host key installed (cloud-init
// for VMs; files of the mounted Secret for a workspace Pod); no other
// session's key appears.
func TestNodeCredentials(t *testing.T) {
	for _, lab := range []string{"cluster", "shell"} {
		t.Run(lab, func(t *testing.T) {
			b := testBuilder(t, lab)
			b.cfg.PlatformSSHKeys = []string{"ssh-ed25519 AAAAgrader grader"}
			b.sess.StudentKey, b.sess.HostKey = "ssh-ed25519 AAAAstudent", "ssh-ed25519 AAAAhost"
			b.sess.Issued.HostPrivateKey = "-----BEGIN OPENSSH PRIVATE KEY-----\nhost\n-----END OPENSSH PRIVATE KEY-----\n"
			s := b.cloudInit(b.lab.Nodes[0], &batchv1.Job{})
			want := map[string]string{
				"ssh-authorized-keys": "ssh-ed25519 AAAAstudent\nssh-ed25519 AAAAgrader grader\n",
				"ssh-host-key":        b.sess.Issued.HostPrivateKey,
				"ssh-host-key.pub":    "ssh-ed25519 AAAAhost\n",
			}
			for k, v := range want {
				if s.StringData[k] != v {
					t.Errorf("Secret %s = %q, want %q", k, s.StringData[k], v)
				}
			}
			ud := s.StringData["userdata"]
			for _, frag := range []string{`- "ssh-ed25519 AAAAstudent"`, `- "ssh-ed25519 AAAAgrader grader"`, "ssh_deletekeys: true",
				`ed25519_public: "ssh-ed25519 AAAAhost"`, `ed25519_private: "-----BEGIN OPENSSH PRIVATE KEY-----\nhost\n`} {
				if !strings.Contains(ud, frag) {
					t.Errorf("cloud-init lacks %q:\n%s", frag, ud)
				}
			}
		})
	}
}

// A Pod lab's guardian takes its cleanup token from its own session's
// Secret, which holds that session's token under the workspace key and
// nothing another session's guardian could use; a VM lab's Secret holds
// none, and without a workspace key guardian gets no token at all (it then
// refuses every cleanup).
func TestCleanupTokenIsTheSessionsOwn(t *testing.T) {
	type got struct {
		SecretToken string
		HasToken    bool
		Env         *corev1.EnvVarSource
	}
	b := testBuilder(t, "shell")
	secret := session.CloudInitName(b.sess.ID, "workspace")
	tests := []struct {
		name string
		lab  string
		key  workspacekey.Key
		want got
	}{
		{"pod lab", "shell", testWorkspaceKey, got{
			SecretToken: testWorkspaceKey.Token(workspacekey.Cleanup, b.sess.ID), HasToken: true,
			Env: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: CleanupTokenKey}},
		}},
		{"pod lab without a workspace key", "shell", workspacekey.Key{}, got{}},
		{"VM lab", "linux", testWorkspaceKey, got{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := testBuilder(t, tt.lab)
			b.cfg.WorkspaceKey = tt.key
			var g got
			g.SecretToken, g.HasToken = b.cloudInit(b.lab.Nodes[0], &batchv1.Job{}).StringData[CleanupTokenKey]
			if tt.lab == "shell" {
				for _, e := range built(t, b).Spec.InitContainers[0].Env {
					if e.Name == "GUARDIAN_CLEANUP_TOKEN" {
						g.Env = e.ValueFrom
					}
				}
			}
			if diff := cmp.Diff(tt.want, g); diff != "" {
				t.Errorf("cleanup token (-want +got):\n%s", diff)
			}
		})
	}
	if other := testWorkspaceKey.Token(workspacekey.Cleanup, "another-session"); other == tests[0].want.SecretToken {
		t.Error("two sessions share a cleanup token")
	}
}

func built(t *testing.T, b builder) *corev1.Pod {
	t.Helper()
	return mustWorkspace(t, b, &batchv1.Job{})
}

func hasEnv(env []corev1.EnvVar, name, value string) bool {
	for _, e := range env {
		if e.Name == name && e.Value == value {
			return true
		}
	}
	return false
}

// Every session's NetworkPolicy lets in only SSH on the lab's port from
// the SSH sources (minus the blocked ranges inside them) and, to a
// workspace Pod, guardian's API from the platform (its namespace, or its
// ranges); lets out only DNS to the cluster's resolver and the internet on
// every other port (never a blocked or link-local range), and, for a
// multi-node lab only, anything between the session's own nodes.
func TestNetworkPolicy(t *testing.T) {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(p int32) *intstr.IntOrString { v := intstr.FromInt32(p); return &v }
	dns := networkingv1.NetworkPolicyEgressRule{
		To: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
		}},
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: port(53)}, {Protocol: &tcp, Port: port(53)}},
	}
	end := func(p int32) *int32 { return &p }
	notDNS := []networkingv1.NetworkPolicyPort{
		{Protocol: &tcp, Port: port(1), EndPort: end(52)}, {Protocol: &tcp, Port: port(54), EndPort: end(65535)},
		{Protocol: &udp, Port: port(1), EndPort: end(52)}, {Protocol: &udp, Port: port(54), EndPort: end(65535)},
	}
	sel := map[string]string{LabelSession: "0b3c6a4e-1f6f-4a50-9d7e-2f3b7d1c9a11", LabelEnv: "dev"}
	self := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: sel}}}
	block := func(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
	}
	v4 := []string{"169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10"}
	v6 := []string{"fe80::/10", "fc00::/7"}
	defaultSources := []networkingv1.NetworkPolicyPeer{block("0.0.0.0/0", v4...), block("::/0", v6...)}
	internet := networkingv1.NetworkPolicyEgressRule{To: defaultSources, Ports: notDNS}
	ssh := func(p int32, from ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyIngressRule {
		return networkingv1.NetworkPolicyIngressRule{From: from, Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(p)}}}
	}
	both := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	guardian := func(ns string) networkingv1.NetworkPolicyIngressRule {
		return networkingv1.NetworkPolicyIngressRule{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(9090)}}, // the definition's guardian-api, by number
		}
	}
	tests := []struct {
		name string
		lab  string
		cfg  func(*Config)
		want networkingv1.NetworkPolicySpec
	}{
		{"pod lab: SSH in on the lab's port, guardian's API from the platform only, DNS and the internet out", "shell", nil, networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: both,
			Ingress: []networkingv1.NetworkPolicyIngressRule{ssh(2222, defaultSources...), guardian("labkeep")},
			Egress:  []networkingv1.NetworkPolicyEgressRule{dns, internet},
		}},
		{"pod lab without a platform namespace: guardian's API closed to every Pod", "shell", func(c *Config) { c.PlatformNamespace = "" }, networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: both,
			Ingress: []networkingv1.NetworkPolicyIngressRule{ssh(2222, defaultSources...)},
			Egress:  []networkingv1.NetworkPolicyEgressRule{dns, internet},
		}},
		{"single VM: the same on port 22, nothing between nodes", "linux", nil, networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: both,
			Ingress: []networkingv1.NetworkPolicyIngressRule{ssh(22, defaultSources...)},
			Egress:  []networkingv1.NetworkPolicyEgressRule{dns, internet},
		}},
		{"multi-node: also anything between the session's own nodes", "cluster", nil, networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: both,
			Ingress: []networkingv1.NetworkPolicyIngressRule{ssh(22, defaultSources...), {From: self}},
			Egress:  []networkingv1.NetworkPolicyEgressRule{dns, internet, {To: self}},
		}},
		{"configured ranges: a source inside a blocked range is allowed whole, link-local stays blocked", "shell", func(c *Config) {
			c.SSHSourceCIDRs = []string{"10.20.0.0/16", "198.51.100.0/24", "10.0.0.0/8"}
			c.EgressBlockedCIDRs = []string{"10.0.0.0/8", "198.51.100.128/25"}
		}, networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: both,
			Ingress: []networkingv1.NetworkPolicyIngressRule{ssh(2222,
				block("10.20.0.0/16"), block("198.51.100.0/24", "198.51.100.128/25"), block("10.0.0.0/8")), guardian("labkeep")},
			Egress: []networkingv1.NetworkPolicyEgressRule{dns, {To: []networkingv1.NetworkPolicyPeer{
				block("0.0.0.0/0", "169.254.0.0/16", "10.0.0.0/8", "198.51.100.128/25"), block("::/0", "fe80::/10")}, Ports: notDNS}},
		}},
		{"pod lab whose guardian posts to an address: that address and port out, even in a blocked range", "shell", func(c *Config) {
			c.GuardianWebhookURL = "http://10.216.3.1:8080/guardianAlert"
			c.WorkspaceKey = workspacekey.Key{Secret: []byte("0123456789abcdef0123456789abcdef"), Env: "dev"}
		}, networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: both,
			Ingress: []networkingv1.NetworkPolicyIngressRule{ssh(2222, defaultSources...), guardian("labkeep")},
			Egress: []networkingv1.NetworkPolicyEgressRule{dns, internet, {
				To: []networkingv1.NetworkPolicyPeer{block("10.216.3.1/32")}, Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(8080)}}}},
		}},
		{"pod lab whose guardian posts to a name: the internet rule covers it", "shell", func(c *Config) {
			c.GuardianWebhookURL = "https://labkeep.example/guardianAlert"
			c.WorkspaceKey = workspacekey.Key{Secret: []byte("0123456789abcdef0123456789abcdef"), Env: "dev"}
		}, networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: both,
			Ingress: []networkingv1.NetworkPolicyIngressRule{ssh(2222, defaultSources...), guardian("labkeep")},
			Egress:  []networkingv1.NetworkPolicyEgressRule{dns, internet},
		}},
		{"VM lab: no guardian, no alert receiver", "linux", func(c *Config) {
			c.GuardianWebhookURL = "http://10.216.3.1:8080/guardianAlert"
			c.WorkspaceKey = workspacekey.Key{Secret: []byte("0123456789abcdef0123456789abcdef"), Env: "dev"}
		}, networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: both,
			Ingress: []networkingv1.NetworkPolicyIngressRule{ssh(22, defaultSources...)},
			Egress:  []networkingv1.NetworkPolicyEgressRule{dns, internet},
		}},
		{"the platform outside the cluster reaches guardian's API from its ranges, blocked or not; another DNS", "shell", func(c *Config) {
			c.PlatformNamespace = ""
			c.PlatformSourceCIDRs = []string{"10.216.3.1/32"}
			c.ClusterDNS = "dns/app=coredns,tier=node"
		}, networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: both,
			Ingress: []networkingv1.NetworkPolicyIngressRule{ssh(2222, defaultSources...), {
				From:  []networkingv1.NetworkPolicyPeer{block("10.216.3.1/32")},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(9090)}}, // the definition's guardian-api, by number
			}},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "dns"}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "coredns", "tier": "node"}},
				}},
				Ports: dns.Ports,
			}, internet},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := testBuilder(t, tc.lab)
			if tc.cfg != nil {
				tc.cfg(&b.cfg)
			}
			if err := b.cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			np := b.networkPolicy(&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: "u"}})
			if diff := cmp.Diff(tc.want, np.Spec); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
			if np.Name != session.NetworkName(b.sess.ID) || np.Labels[LabelRole] != RoleNetwork || np.OwnerReferences[0].UID != "u" {
				t.Errorf("metadata = %+v", np.ObjectMeta)
			}
		})
	}
}

// The policy's selector picks exactly the Pods that carry the session's
// traffic: the workspace Pod, and the virt-launcher Pods, which carry
// their VMI's labels, i.e. the VM template's (as KubeVirt's and virtsim's
// launcher Pods do); not the anchor's Pod, not another session's nodes.
func TestNetworkPolicySelectsTheSessionsNodes(t *testing.T) {
	anchor := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: "u"}}
	other := testBuilder(t, "cluster")
	other.sess.ID = "7f000000-0000-4000-8000-000000000001"
	otherEnv := testBuilder(t, "cluster")
	otherEnv.cfg.Env = "prod"
	launcher := func(b builder) map[string]string {
		l := maps.Clone(b.vm(b.lab.Nodes[0], anchor).Spec.Template.ObjectMeta.Labels)
		l["kubevirt.io"], l["kubevirt.io/created-by"] = "virt-launcher", "vmi-uid"
		return l
	}
	tests := []struct {
		name   string
		lab    string
		labels func(builder) map[string]string
		want   bool
	}{
		{"workspace Pod", "shell", func(b builder) map[string]string { return mustWorkspace(t, b, anchor).Labels }, true},
		{"launcher Pod of a single VM", "linux", launcher, true},
		{"launcher Pod of a multi-node lab", "cluster", launcher, true},
		{"the anchor's Pod", "shell", func(b builder) map[string]string { return b.anchor().Spec.Template.Labels }, false},
		{"another session's launcher Pod", "cluster", func(builder) map[string]string { return launcher(other) }, false},
		{"the same session id in another environment", "cluster", func(builder) map[string]string { return launcher(otherEnv) }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := testBuilder(t, tc.lab)
			sel, err := metav1.LabelSelectorAsSelector(&b.networkPolicy(anchor).Spec.PodSelector)
			if err != nil {
				t.Fatal(err)
			}
			if got := sel.Matches(labels.Set(tc.labels(b))); got != tc.want {
				t.Errorf("selector %s matches %v = %v, want %v", sel, tc.labels(b), got, tc.want)
			}
		})
	}
}

// The port a Pod lab's policy opens to the platform by name is guardian's
// API port in the workspace Pod, and only guardian's.
func TestGuardianAPIPortIsGuardians(t *testing.T) {
	pod := mustWorkspace(t, testBuilder(t, "shell"), &batchv1.Job{})
	var owners []string
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		for _, p := range c.Ports {
			if p.Name == labs.GuardianAPIPort {
				owners = append(owners, c.Name)
			}
		}
	}
	if diff := cmp.Diff([]string{"guardian"}, owners); diff != "" {
		t.Errorf("containers with port %q (-want +got):\n%s", labs.GuardianAPIPort, diff)
	}
}
