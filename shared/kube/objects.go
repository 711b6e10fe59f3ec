package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/yaml"

	"labkeep/infra"
	"labkeep/shared/alerts"
	"labkeep/shared/labs"
	"labkeep/shared/session"
	"labkeep/shared/workspacekey"
)

// Labels every labkeep object carries. The reaper only ever touches objects
// whose LabelEnv equals its own environment.
const (
	LabelEnv     = "labkeep.io/env"
	LabelSession = "labkeep.io/session"
	LabelRole    = "labkeep.io/role"
	LabelNode    = "labkeep.io/node"
	// LabelStudent is a hash of the student id: enough to group a student's
	// objects, without putting personal data into the cluster.
	LabelStudent = "labkeep.io/student"
	// LabelAnchorOf marks the deadline anchor Job's own Pod, which the Job
	// controller owns and deletes; it deliberately has no LabelEnv so the
	// reaper never mistakes it for a workspace.
	LabelAnchorOf = "labkeep.io/anchor-of"
)

// RoleAnchor and RoleNetwork are the labkeep.io/role values of the objects
// that belong to the whole session rather than to one node.
const (
	RoleAnchor  = "anchor"
	RoleNetwork = "network"
)

// StudentHash is the value of LabelStudent for student.
func StudentHash(student string) string {
	sum := sha256.Sum256([]byte(student))
	return hex.EncodeToString(sum[:16])
}

// builder turns a session and its lab into Kubernetes objects. It is pure,
// so object shapes are unit-tested without a cluster.
type builder struct {
	cfg  Config
	sess session.Session
	lab  labs.Lab
	// pod is the workspace Pod definition (ParseWorkspacePod).
	pod *corev1.Pod
	// liveKeys gives each VM root's authorized keys from its node's keys
	// Secret through the guest agent (credentials.go), so they can change
	// while it runs; without it a VM has only what cloud-init gave it at
	// boot.
	liveKeys bool
}

func (b builder) labels(role, node string) map[string]string {
	l := map[string]string{
		LabelEnv:                       b.cfg.Env,
		LabelSession:                   b.sess.ID,
		LabelRole:                      role,
		"app.kubernetes.io/managed-by": "labkeep",
	}
	if b.sess.Pool == "" {
		l[LabelStudent] = StudentHash(b.sess.Student)
	} else {
		l[LabelPool] = PoolWarm
	}
	if node != "" {
		l[LabelNode] = node
	}
	return l
}

// deadlineSeconds is how long Kubernetes lets the session live if the
// whole backend is gone: the maximum lifetime plus a grace period, rounded
// up to a whole second so it can never fire early, and at least 1 (New
// refuses a non-positive sum; 0 would be rejected by the API server).
func (b builder) deadlineSeconds() int64 {
	d := b.cfg.MaxLifetime + b.cfg.DeadlineGrace
	if b.sess.Pool == session.PoolIdle {
		// A pool instance's window is its TTL; a claim within it starts
		// a session of at most MaxLifetime.
		d += b.sess.MaxExpiresAt.Sub(b.sess.StartedAt)
	}
	secs := int64(d / time.Second)
	if d%time.Second > 0 {
		secs++
	}
	return max(secs, 1)
}

// anchor is the session's deadline anchor: a Job whose Pod only waits
// (pause) until activeDeadlineSeconds fails the Job, after which the TTL
// controller deletes it and the garbage collector everything it owns.
// Anything else that ends the Job ends the session too, so the Job must
// outlive its Pod:
//   - a Pod failure with the DisruptionTarget condition (drain, eviction,
//     preemption, node loss, PodGC) is ignored and the Pod replaced;
//   - other Pod failures are retried AnchorBackoffLimit times;
//   - a Pod that ends Succeeded (pause exits 0 on SIGTERM, so a drained or
//     deleted anchor Pod usually does) is replaced until AnchorCompletions
//     successes, one at a time (parallelism 1).
func (b builder) anchor() *batchv1.Job {
	deadline := b.deadlineSeconds()
	zero := int32(0)
	grace := int64(0)
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name:      session.AnchorName(b.sess.ID),
			Namespace: b.cfg.Namespace,
			Labels:    b.labels(RoleAnchor, ""),
		},
		Spec: batchv1.JobSpec{
			ActiveDeadlineSeconds:   &deadline,
			TTLSecondsAfterFinished: &zero,
			BackoffLimit:            ptr(b.cfg.AnchorBackoffLimit),
			Completions:             ptr(b.cfg.AnchorCompletions),
			Parallelism:             ptr(int32(1)),
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
				Action: batchv1.PodFailurePolicyActionIgnore,
				OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{
					Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
				}},
			}}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelAnchorOf: b.sess.ID}},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: &grace,
					AutomountServiceAccountToken:  ptr(false),
					// pause needs nothing: the anchor's Pod meets the
					// restricted Pod Security level, as the sessions
					// namespace's admission policy asks of every container
					// but guardian.
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr(true),
						RunAsUser:      ptr(int64(65535)),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:  "pause",
						Image: b.cfg.AnchorImage,
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr(false),
							ReadOnlyRootFilesystem:   ptr(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1m"), corev1.ResourceMemory: resource.MustParse("8Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
						},
					}},
				},
			},
		},
	}
}

// owned returns metadata owned by the anchor, set at creation (the backend
// cannot patch Secrets later, by design).
func (b builder) owned(name, role, node string, anchor *batchv1.Job) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: b.cfg.Namespace,
		Labels:    b.labels(role, node),
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "batch/v1",
			Kind:       "Job",
			Name:       anchor.Name,
			UID:        anchor.UID,
		}},
	}
}

func (b builder) cloudInit(n labs.Node, anchor *batchv1.Job) *corev1.Secret {
	keys := authorizedKeys(b.sess, b.cfg)
	var ud strings.Builder
	ud.WriteString("#cloud-config\n")
	fmt.Fprintf(&ud, "hostname: %s\n", n.Name)
	ud.WriteString("disable_root: false\nssh_pwauth: false\n")
	ud.WriteString("ssh_authorized_keys:\n")
	for _, k := range keys {
		fmt.Fprintf(&ud, "  - %q\n", k)
	}
	// The session's own host key replaces the image's, so the student's
	// first connection can be verified against the session's hostKey.
	ud.WriteString("ssh_deletekeys: true\nssh_keys:\n")
	fmt.Fprintf(&ud, "  ed25519_private: %q\n  ed25519_public: %q\n", b.sess.Issued.HostPrivateKey, b.sess.HostKey)
	ud.WriteString("write_files:\n")
	fmt.Fprintf(&ud, "  - path: /etc/labkeep/grading-token\n    permissions: '0600'\n    content: %q\n", b.sess.GradingToken)
	fmt.Fprintf(&ud, "  - path: /etc/labkeep/session\n    permissions: '0644'\n    content: %q\n", b.sess.ID+"\n")
	ud.WriteString(b.homeCloudConfig(n))
	data := map[string]string{
		"userdata":            ud.String(),
		"grading-token":       b.sess.GradingToken,
		"ssh-authorized-keys": strings.Join(keys, "\n") + "\n",
		"ssh-host-key":        b.sess.Issued.HostPrivateKey,
		"ssh-host-key.pub":    b.sess.HostKey + "\n",
	}
	if tok := b.cleanupToken(); tok != "" {
		data[CleanupTokenKey] = tok
	}
	return &corev1.Secret{
		ObjectMeta: b.owned(session.CloudInitName(b.sess.ID, n.Name), n.Role, n.Name, anchor),
		Immutable:  ptr(true),
		Type:       corev1.SecretTypeOpaque,
		// A workspace Pod mounts these keys at /etc/labkeep: its image
		// runs sshd with ssh-host-key and ssh-authorized-keys.
		StringData: data,
	}
}

// CleanupTokenKey is the key of a Pod lab's Secret holding its guardian's
// cleanup token, which guardian's GUARDIAN_CLEANUP_TOKEN takes by
// secretKeyRef (the admission policy admits no other source).
const CleanupTokenKey = "guardian-cleanup-token"

// cleanupToken is the session's own guardian cleanup token (workspacekey's
// Cleanup use), for a Pod lab with a workspace key; "" otherwise. It sits
// in the session's Secret, which the workspace mounts: the workspace's
// root can read it, and it opens this session's guardian alone, which
// that root can already kill processes in.
func (b builder) cleanupToken() string {
	if b.lab.Kind != labs.KindPod {
		return ""
	}
	return b.cfg.WorkspaceKey.Token(workspacekey.Cleanup, b.sess.ID)
}

func (b builder) resources(n labs.Node) corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse(n.CPU),
		corev1.ResourceMemory: resource.MustParse(n.Memory),
	}
}

func (b builder) multiNode() bool { return len(b.lab.Nodes) > 1 }

func (b builder) vm(n labs.Node, anchor *batchv1.Job) *kubevirtv1.VirtualMachine {
	name := session.NodeName(b.sess.ID, n.Name)
	always := kubevirtv1.RunStrategyAlways
	grace := int64(30)
	mem := resource.MustParse(n.Memory)
	spec := kubevirtv1.VirtualMachineInstanceSpec{
		Hostname:                      n.Name,
		TerminationGracePeriodSeconds: &grace,
		Domain: kubevirtv1.DomainSpec{
			// Requests equal limits: VM memory is never overcommitted.
			Resources: kubevirtv1.ResourceRequirements{Requests: b.resources(n), Limits: b.resources(n)},
			Memory:    &kubevirtv1.Memory{Guest: &mem},
			Devices: kubevirtv1.Devices{
				Disks: []kubevirtv1.Disk{
					{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
					{Name: "cloudinit", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
				},
				Interfaces: []kubevirtv1.Interface{{
					Name:                   "default",
					InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
				}},
			},
		},
		Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
		Volumes: []kubevirtv1.Volume{{
			Name: "cloudinit",
			VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{
				UserDataSecretRef: &corev1.LocalObjectReference{Name: session.CloudInitName(b.sess.ID, n.Name)},
			}},
		}},
	}
	if b.multiNode() {
		spec.Subdomain = session.NetworkName(b.sess.ID)
	}
	if b.liveKeys {
		spec.AccessCredentials = accessCredentials(b.sess.ID, n.Name)
	}
	// Ready only once a student can log in (the lab's readiness, TCP on
	// the SSH port by default), so running means SSH answers.
	r := b.lab.VMReadiness()
	spec.ReadinessProbe = &kubevirtv1.Probe{
		Handler:             kubevirtv1.Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(r.TCPPort)}},
		InitialDelaySeconds: r.InitialDelaySeconds,
		PeriodSeconds:       r.PeriodSeconds,
	}
	vm := &kubevirtv1.VirtualMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine"},
		ObjectMeta: b.owned(name, n.Role, n.Name, anchor),
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &always,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: b.labels(n.Role, n.Name)},
			},
		},
	}
	root := kubevirtv1.Volume{Name: "root"}
	if g := b.lab.Disk.GoldenPVC; g != nil {
		dv := name + "-root"
		root.VolumeSource = kubevirtv1.VolumeSource{DataVolume: &kubevirtv1.DataVolumeSource{Name: dv}}
		storage := &cdiv1.StorageSpec{
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(g.Size)}},
		}
		if g.StorageClassName != "" {
			storage.StorageClassName = &g.StorageClassName
		}
		vm.Spec.DataVolumeTemplates = []kubevirtv1.DataVolumeTemplateSpec{{
			ObjectMeta: metav1.ObjectMeta{Name: dv, Labels: b.labels(n.Role, n.Name)},
			Spec: cdiv1.DataVolumeSpec{
				Source:  &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: g.Namespace, Name: g.Name}},
				Storage: storage,
			},
		}}
	} else {
		root.VolumeSource = kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: b.lab.Disk.ContainerDisk}}
	}
	spec.Volumes = append([]kubevirtv1.Volume{root}, spec.Volumes...)
	b.homeDisk(n, &spec)
	vm.Spec.Template.Spec = spec
	return vm
}

// service is a headless Service giving every node of a multi-node session
// a stable DNS name (<node>.<service>) for the others.
func (b builder) service(anchor *batchv1.Job) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: b.owned(session.NetworkName(b.sess.ID), RoleNetwork, "", anchor),
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 map[string]string{LabelSession: b.sess.ID, LabelEnv: b.cfg.Env},
			PublishNotReadyAddresses: true,
			Ports:                    []corev1.ServicePort{{Name: "ssh", Port: b.lab.SSHPort, TargetPort: intstr.FromInt32(b.lab.SSHPort)}},
		},
	}
}

// networkPolicy confines one session's network; every session has one,
// created before any of its nodes, so an engine's first rules for a node's
// Pod already carry it. An engine still programs a new Pod only after the
// Pod has an address: on the local node 0.35 s later (guardian answers
// after 0.05 s; the student's first login comes about 3 s after the open),
// measured by test/podlab's BenchmarkTablePolicyEnforcement. It
// selects, by the session and environment labels, every Pod that carries
// the session's traffic: the workspace Pod of a Pod lab, and the
// virt-launcher Pods of a VM lab (KubeVirt and virtsim both label a
// launcher Pod with its VMI's labels, which are the VM template's). Being
// selected for both directions, such a Pod may exchange nothing but:
//   - in: the lab's SSH port from cfg.SSHSourceCIDRs (a blocked range
//     inside a source range stays blocked, so other sessions' Pods cannot
//     reach it);
//   - out: DNS (53 UDP and TCP) to the cluster's DNS Pods only
//     (cfg.ClusterDNS), and TCP and UDP on every other port to anything
//     outside the blocked ranges (egressBlocked): the internet, never the
//     cluster's Pods, Services, nodes or a cloud's metadata service, and
//     no resolver but the cluster's (NetworkPolicy matches the DNS Pods
//     after the Service address is translated);
//   - in, for a Pod lab: guardian's API port from the Pods of
//     cfg.PlatformNamespace and from cfg.PlatformSourceCIDRs (the
//     functions' cleanup call);
//   - out, for a Pod lab whose guardian posts alerts to an address
//     (cfg.GuardianWebhookURL names an IP): that address and port, even
//     inside a blocked range (alertReceiver);
//   - for a multi-node lab, anything to and from the session's own nodes.
//
// Connections from the Pod's own node (the kubelet's probes) are allowed
// by NetworkPolicy's own rules; every other port (guardian's API too, for
// everyone but the platform) is closed to the rest of the cluster.
func (b builder) networkPolicy(anchor *batchv1.Job) *networkingv1.NetworkPolicy {
	sel := map[string]string{LabelSession: b.sess.ID, LabelEnv: b.cfg.Env}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	ssh, dns := intstr.FromInt32(b.lab.SSHPort), intstr.FromInt32(53)
	belowDNS, aboveDNS := intstr.FromInt32(1), intstr.FromInt32(54)
	lastBelow, lastAbove := int32(52), int32(65535)
	resolver, _ := parseClusterDNS(b.cfg.ClusterDNS) // Validate refused a bad one
	blocked := b.cfg.egressBlocked()
	spec := networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: sel},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  ipBlocks(b.cfg.SSHSourceCIDRs, blocked),
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &ssh}},
		}},
		Egress: []networkingv1.NetworkPolicyEgressRule{
			{
				To: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: resolver.namespace}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: resolver.labels},
				}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &dns}, {Protocol: &tcp, Port: &dns}},
			},
			{
				To: ipBlocks(everywhere, blocked),
				Ports: []networkingv1.NetworkPolicyPort{
					{Protocol: &tcp, Port: &belowDNS, EndPort: &lastBelow}, {Protocol: &tcp, Port: &aboveDNS, EndPort: &lastAbove},
					{Protocol: &udp, Port: &belowDNS, EndPort: &lastBelow}, {Protocol: &udp, Port: &aboveDNS, EndPort: &lastAbove},
				},
			},
		},
	}
	if b.lab.Kind == labs.KindPod && (b.cfg.PlatformNamespace != "" || len(b.cfg.PlatformSourceCIDRs) > 0) {
		guardian := b.guardianAPIPort()
		var from []networkingv1.NetworkPolicyPeer
		if b.cfg.PlatformNamespace != "" {
			from = append(from, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: b.cfg.PlatformNamespace}}})
		}
		from = append(from, ipBlocks(b.cfg.PlatformSourceCIDRs, nil)...)
		spec.Ingress = append(spec.Ingress, networkingv1.NetworkPolicyIngressRule{
			From:  from,
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &guardian}},
		})
	}
	if to, port, ok := alertReceiver(b.cfg.GuardianWebhookURL); ok && b.lab.Kind == labs.KindPod {
		spec.Egress = append(spec.Egress, networkingv1.NetworkPolicyEgressRule{
			To:    ipBlocks([]string{to}, nil),
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
		})
	}
	if b.multiNode() {
		self := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: sel}}}
		spec.Ingress = append(spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: self})
		spec.Egress = append(spec.Egress, networkingv1.NetworkPolicyEgressRule{To: self})
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: b.owned(session.NetworkName(b.sess.ID), RoleNetwork, "", anchor),
		Spec:       spec,
	}
}

// guardianAPIPort is guardian's API port by number, as the workspace Pod
// definition declares it: a named port of an init container (guardian is a
// native sidecar) is not resolved by every NetworkPolicy engine (kube-router
// reads the regular containers only), a number is. Without a definition it
// is the name.
func (b builder) guardianAPIPort() intstr.IntOrString {
	if b.pod != nil {
		for _, c := range append(slices.Clone(b.pod.Spec.InitContainers), b.pod.Spec.Containers...) {
			for _, p := range c.Ports {
				if p.Name == labs.GuardianAPIPort {
					return intstr.FromInt32(p.ContainerPort)
				}
			}
		}
	}
	return intstr.FromString(labs.GuardianAPIPort)
}

// alertReceiver is the address (as a one-address CIDR) and TCP port of
// guardian's webhook when base names an IP address, which may be inside a
// blocked range (a platform address); ok is false for a host name, which
// the internet rule (or the platform's own Service) covers, and for no
// webhook.
func alertReceiver(base string) (cidr string, port intstr.IntOrString, ok bool) {
	u, err := url.Parse(base)
	if err != nil || base == "" {
		return "", port, false
	}
	addr, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return "", port, false
	}
	p := u.Port()
	if p == "" {
		p = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return "", port, false
	}
	return netip.PrefixFrom(addr, addr.BitLen()).String(), intstr.FromInt(n), true
}

// everywhere is every IPv4 and IPv6 address.
var everywhere = []string{"0.0.0.0/0", "::/0"}

// ipBlocks is one ipBlock peer per CIDR of cidrs, each excepting the
// blocked ranges of its family that lie strictly inside it (the only
// exceptions the API server accepts). A CIDR equal to or inside a blocked
// range is allowed whole: naming it is an explicit choice. cidrs and
// blocked are valid CIDRs (Config.Validate).
func ipBlocks(cidrs, blocked []string) []networkingv1.NetworkPolicyPeer {
	peers := make([]networkingv1.NetworkPolicyPeer, 0, len(cidrs))
	for _, c := range cidrs {
		outer := netip.MustParsePrefix(c)
		block := &networkingv1.IPBlock{CIDR: c}
		for _, x := range blocked {
			inner := netip.MustParsePrefix(x)
			if inner.Addr().Is4() == outer.Addr().Is4() && inner.Bits() > outer.Bits() && outer.Contains(inner.Addr()) {
				block.Except = append(block.Except, x)
			}
		}
		peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: block})
	}
	return peers
}

// workspace is the Pod of a pod-kind session, built from the one workspace
// Pod definition (infra.WorkspacePod: guardian as a native sidecar that
// starts first and is restarted if the user kills it, the student's
// container without the capabilities guardian relies on). Only what differs
// per session is filled in: name, labels and owner, the hostname and
// deadline, the guardian and lab images, the lab's SSH port (the
// workspace's port and guardian's probe address), the node's resources,
// the session's Secret, mounted at /etc/labkeep in both containers,
// guardian's cleanup token from that Secret and, with GuardianWebhookURL
// set, guardian's webhook with the session's own credentials.
func (b builder) workspace(anchor *batchv1.Job) (*corev1.Pod, error) {
	if b.pod == nil {
		return nil, errors.New("no workspace Pod definition")
	}
	pod := b.pod.DeepCopy()
	n := b.lab.Nodes[0]
	deadline := b.deadlineSeconds()
	meta := b.owned(session.NodeName(b.sess.ID, n.Name), n.Role, n.Name, anchor)
	for k, v := range pod.Labels {
		if _, set := meta.Labels[k]; !set {
			meta.Labels[k] = v
		}
	}
	pod.ObjectMeta = meta
	pod.Spec.ActiveDeadlineSeconds = &deadline
	pod.Spec.Hostname = n.Name
	labkeepMount := corev1.VolumeMount{Name: "labkeep", MountPath: "/etc/labkeep", ReadOnly: true}
	pod.Spec.Volumes = append([]corev1.Volume{{Name: "labkeep", VolumeSource: corev1.VolumeSource{
		Secret: &corev1.SecretVolumeSource{SecretName: session.CloudInitName(b.sess.ID, n.Name)}}}}, pod.Spec.Volumes...)

	g := &pod.Spec.InitContainers[0]
	g.Image = b.cfg.GuardianImage
	g.VolumeMounts = append([]corev1.VolumeMount{labkeepMount}, g.VolumeMounts...)
	for i := range g.Env {
		if g.Env[i].Name == "GUARDIAN_SSH_ADDR" {
			g.Env[i].Value = fmt.Sprintf("127.0.0.1:%d", b.lab.SSHPort)
		}
	}
	// guardian posts its alerts with this session's own credentials. They
	// sit in guardian's environment, which the workspace's root cannot read
	// (guardian holds capabilities the workspace lacks, so the kernel
	// closes /proc/<guardian>/environ to it), not in the session's Secret,
	// which the workspace mounts.
	if b.cfg.GuardianWebhookURL != "" {
		setEnv(g, corev1.EnvVar{Name: "GUARDIAN_WEBHOOK_URL",
			Value: alerts.Key(b.cfg.WorkspaceKey).WebhookURL(b.cfg.GuardianWebhookURL, b.sess.ID)})
	}
	// guardian's cleanup token is this session's own, from this session's
	// Secret (cloudInit); without a workspace key there is none, and
	// guardian refuses every cleanup.
	cleanup := corev1.EnvVar{Name: "GUARDIAN_CLEANUP_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: session.CloudInitName(b.sess.ID, n.Name)}, Key: CleanupTokenKey}}}
	if b.cleanupToken() == "" {
		g.Env = slices.DeleteFunc(g.Env, func(e corev1.EnvVar) bool { return e.Name == cleanup.Name })
	} else {
		setEnv(g, cleanup)
	}
	w := &pod.Spec.Containers[0]
	w.Image = b.lab.Image
	w.Ports[0].ContainerPort = b.lab.SSHPort
	for i := range w.Env {
		if w.Env[i].Name == "LABKEEP_SSH_PORT" {
			w.Env[i].Value = strconv.Itoa(int(b.lab.SSHPort))
		}
	}
	w.Resources = corev1.ResourceRequirements{Requests: b.resources(n), Limits: b.resources(n)}
	w.VolumeMounts = append([]corev1.VolumeMount{labkeepMount}, w.VolumeMounts...)
	b.homeMount(pod)
	b.keepClaimedKeys(pod)
	// The lab's opt-ins (labs.OptInCapabilities) on top of the workspace
	// set; ParseWorkspacePod made sure the definition has a capabilities
	// block that drops ALL.
	for _, c := range b.lab.Capabilities {
		if !slices.Contains(w.SecurityContext.Capabilities.Add, corev1.Capability(c)) {
			w.SecurityContext.Capabilities.Add = append(w.SecurityContext.Capabilities.Add, corev1.Capability(c))
		}
	}
	return pod, nil
}

// setEnv sets c's variable e.Name to e, in place, or appends it.
func setEnv(c *corev1.Container, e corev1.EnvVar) {
	for i := range c.Env {
		if c.Env[i].Name == e.Name {
			c.Env[i] = e
			return
		}
	}
	c.Env = append(c.Env, e)
}

// ParseWorkspacePod decodes a workspace Pod definition (data, or
// infra.WorkspacePod when data is empty) and checks it has the shape
// workspace fills in: guardian as the first init container, the workspace
// as the only container with its SSH port first.
func ParseWorkspacePod(data []byte) (*corev1.Pod, error) {
	if len(data) == 0 {
		data = infra.WorkspacePod()
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(data, &pod); err != nil {
		return nil, fmt.Errorf("workspace Pod definition: %w", err)
	}
	switch {
	case pod.Kind != "Pod":
		return nil, fmt.Errorf("workspace Pod definition: kind %q, want Pod", pod.Kind)
	case len(pod.Spec.InitContainers) == 0 || pod.Spec.InitContainers[0].Name != "guardian":
		return nil, errors.New("workspace Pod definition: the first init container must be guardian")
	case len(pod.Spec.Containers) != 1 || pod.Spec.Containers[0].Name != labs.WorkspaceContainer:
		return nil, fmt.Errorf("workspace Pod definition: the one container must be %q", labs.WorkspaceContainer)
	case len(pod.Spec.Containers[0].Ports) == 0 || pod.Spec.Containers[0].Ports[0].Name != "ssh":
		return nil, errors.New("workspace Pod definition: the workspace's first port must be ssh")
	}
	if err := confined(pod.Spec.SecurityContext, pod.Spec.Containers[0].SecurityContext); err != nil {
		return nil, fmt.Errorf("workspace Pod definition: the %s container %w", labs.WorkspaceContainer, err)
	}
	return &pod, nil
}

// WorkspaceCapabilities is the workspace set: every capability a workspace
// container may hold (a usable root shell behind sshd; the reasons are in
// infra/guardian/workspace-pod.yaml). A definition may ask for fewer
// (a platform whose nodes cannot grant one), never for more; a lab adds
// only labs.OptInCapabilities. The sessions namespace's admission policy
// (infra/base/admission-policy.yaml) admits the same set.
var WorkspaceCapabilities = []corev1.Capability{
	"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID", "SYS_CHROOT",
}

// confined checks a workspace container's security context (sc, over the
// Pod's pod) confines root as labkeep promises: not privileged, no
// privilege escalation (no_new_privs), the runtime's default or a node's
// own seccomp profile, and capabilities dropped to ALL with at most the
// workspace set added back.
func confined(pod *corev1.PodSecurityContext, sc *corev1.SecurityContext) error {
	if sc == nil {
		return errors.New("has no securityContext (it must drop ALL capabilities, set allowPrivilegeEscalation: false and a RuntimeDefault seccomp profile)")
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && pod != nil {
		seccomp = pod.SeccompProfile
	}
	switch {
	case sc.Privileged != nil && *sc.Privileged:
		return errors.New("must not be privileged")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		return errors.New("must set allowPrivilegeEscalation: false")
	case seccomp == nil || (seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault && seccomp.Type != corev1.SeccompProfileTypeLocalhost):
		return errors.New("must run under the RuntimeDefault (or a Localhost) seccomp profile")
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL"):
		return errors.New("must drop ALL capabilities and add back only what it needs")
	}
	for _, c := range sc.Capabilities.Add {
		if !slices.Contains(WorkspaceCapabilities, c) {
			return fmt.Errorf("adds capability %s, outside the workspace set %v (a lab opts in to NET_RAW in its template)", c, WorkspaceCapabilities)
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
