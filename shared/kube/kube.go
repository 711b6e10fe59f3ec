// Package kube is the Kubernetes adapter of session.Cluster (client-go and
// the KubeVirt clientset): it creates a session's deadline anchor, cloud-init
// Secrets, NetworkPolicy, VirtualMachines and Service or workspace Pod;
// observes readiness; deletes by name; and gives the reaper a one-list-per-
// kind inventory of the namespace. All objects live in one namespace, carry
// the labels in this package, and are owned by the session's anchor Job, so
// Kubernetes itself deletes them when the anchor's deadline passes even if
// labkeep is gone.
package kube

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubevirt"

	"labkeep/infra"
	"labkeep/shared/alerts"
	"labkeep/shared/labs"
	"labkeep/shared/reap"
	"labkeep/shared/session"
	"labkeep/shared/setting"
	"labkeep/shared/workspacekey"
)

// Config says where and how sessions are created.
type Config struct {
	// Namespace holds every session object (shared by environments).
	Namespace string
	// Env is this backend's environment, the value of labkeep.io/env.
	Env string
	// MaxLifetime + DeadlineGrace, rounded up to whole seconds, is the
	// anchor's activeDeadlineSeconds (and a workspace Pod's): the real
	// deadline, never earlier. Their sum must be positive.
	MaxLifetime   time.Duration
	DeadlineGrace time.Duration
	// AnchorImage is the tiny container the anchor Job runs.
	AnchorImage string
	// AnchorBackoffLimit is how many failures of the anchor's Pod that are
	// not disruptions (its container crashing, say) the anchor Job
	// survives; a failed Job is deleted at once and takes the session with
	// it. Failures with the DisruptionTarget condition (drain, eviction,
	// preemption, node loss) never count.
	AnchorBackoffLimit int32
	// AnchorCompletions is how many times the anchor's Pod may end
	// successfully before the Job completes (and is deleted with the
	// session): the pause container exits 0 on SIGTERM, so a drained or
	// deleted anchor Pod ends Succeeded, and each such end must only be
	// replaced.
	AnchorCompletions int32
	// GuardianImage is the sidecar of workspace Pods.
	GuardianImage string
	// GuardianWebhookURL, when set, is labkeep's POST /guardianAlert as
	// workspaces reach it: each workspace Pod's guardian gets it as
	// GUARDIAN_WEBHOOK_URL with its own session's credentials (alerts.Key's
	// WebhookURL under WorkspaceKey), so a workspace can post alerts for
	// its own session only. Empty: the definition's GUARDIAN_WEBHOOK_URL
	// stays.
	GuardianWebhookURL string
	// WorkspaceKey derives each workspace's own credentials: its alert
	// webhook's and its guardian's cleanup token, which goes into the
	// session's Secret (CleanupTokenKey) and from there into guardian's
	// GUARDIAN_CLEANUP_TOKEN. Its zero value derives none: guardian then
	// has no cleanup token and refuses every cleanup.
	WorkspaceKey workspacekey.Key
	// PlatformSSHKeys are the platform's own keys (a grader's, an
	// operator's), authorized on every node of every session next to the
	// session's student key. Whoever holds one enters every student's lab:
	// they are for the platform, never for students.
	PlatformSSHKeys []string
	// WorkspacePod is the workspace Pod definition every Pod lab's Pod is
	// built from (YAML, see infra/guardian/workspace-pod.yaml, which empty
	// means): a platform may add tolerations, a node selector or a runtime
	// class, or drop a capability its nodes cannot grant. The admission
	// policy admits only the tolerations and runtime classes its
	// parameters list (tolerations, runtimeClasses), and guardian's
	// container exactly as labkeep builds it (environment, mounts, probes).
	WorkspacePod []byte
	// SSHSourceCIDRs are where students' SSH connections reach the labs
	// from (the internet, or the SSH ingress or load balancer in front):
	// each session's NetworkPolicy lets SSH in from these ranges only,
	// minus the EgressBlockedCIDRs inside them. At least one.
	SSHSourceCIDRs []string
	// EgressBlockedCIDRs are the ranges a lab never reaches (nor is reached
	// from over SSH): the cluster's Pod, Service and node ranges and any
	// other internal network. Link-local addresses (169.254.0.0/16 with
	// the cloud metadata service, fe80::/10) are always blocked besides.
	// Everything else is the internet, which labs may reach.
	EgressBlockedCIDRs []string
	// PlatformNamespace is the namespace labkeep's functions run in: its
	// Pods may reach guardian's API port of a workspace Pod (the terminal's
	// cleanup button) and nothing else of a lab. Empty: no Pod may.
	PlatformNamespace string
	// PlatformSourceCIDRs are where the functions' calls to guardian come
	// from when they do not run as Pods of PlatformNamespace (a cloud's
	// functions behind a fixed egress address, the local stack's host):
	// these ranges may reach guardian's API port too, blocked ranges
	// included. Empty: only PlatformNamespace's Pods.
	PlatformSourceCIDRs []string
	// ClusterDNS selects the cluster's DNS Pods, "namespace/key=value"
	// (more labels after commas): the only resolver a lab may ask. DNS to
	// any other address is refused, so a lab cannot tunnel through a
	// resolver of its own choice.
	ClusterDNS string
	// HomeStorageClass is the StorageClass of students' homes (labs.Home);
	// empty: the cluster's default.
	HomeStorageClass string
	// HomeTotal is the most the homes of one student in this environment
	// may hold together (their claims' sizes): an open that would make a
	// new home past it is refused with session.ErrHomeQuota.
	HomeTotal resource.Quantity
	// HomeReaderImage is the image of a home reader (homereader.go), the
	// Pod that reads a home no session holds for its download: any image
	// of the admission policy's allowlist with sleep and a tar that writes
	// gzip (GNU tar or busybox); labkeep's workspace image by default.
	HomeReaderImage string
	// CallTimeout bounds every single API call.
	CallTimeout time.Duration
	// QPS and Burst are the client-side rate limits towards the API server
	// (client-go's default of 5 QPS is far too low for a reaper run over
	// hundreds of sessions); NewForConfig applies them.
	QPS   float32
	Burst int
}

// DefaultConfig is the adapter's configuration unless told otherwise;
// Env and MaxLifetime have no default (the caller's policy decides them).
func DefaultConfig() Config {
	return Config{
		Namespace:          "labkeep-sessions",
		DeadlineGrace:      15 * time.Minute,
		AnchorImage:        "registry.k8s.io/pause:3.10",
		AnchorBackoffLimit: 6,
		AnchorCompletions:  100,
		GuardianImage:      "ghcr.io/labkeep/guardian:latest",
		SSHSourceCIDRs:     []string{"0.0.0.0/0", "::/0"},
		// The private and shared ranges clusters take their Pod, Service
		// and node addresses from (RFC 1918, RFC 6598, IPv6 ULA).
		EgressBlockedCIDRs: []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"},
		PlatformNamespace:  infra.FunctionsNamespace,
		HomeTotal:          resource.MustParse("10Gi"),
		HomeReaderImage:    "ghcr.io/labkeep/workspace:debian12",
		ClusterDNS:         "kube-system/k8s-app=kube-dns",
		CallTimeout:        10 * time.Second,
		QPS:                50,
		Burst:              100,
	}
}

// Validate reports a configuration no session could be created with.
func (c Config) Validate() error {
	_, err := c.validate()
	return err
}

// guardianWebhook checks the optional webhook base URL and that there is a
// key to sign its credentials with.
func guardianWebhook(url string, key workspacekey.Key) error {
	switch {
	case url == "":
		return nil
	case !key.Enabled():
		return setting.Invalid("GuardianWebhookURL", "needs a key for the workspaces' credentials")
	}
	if err := alerts.CheckWebhookURL(url); err != nil {
		return setting.Invalid("GuardianWebhookURL", "%v", err)
	}
	return nil
}

// validate is Validate, also returning the parsed workspace Pod
// definition, so New parses it once.
func (c Config) validate() (*corev1.Pod, error) {
	var errs []error
	bad := func(field, format string, args ...any) { errs = append(errs, setting.Invalid(field, format, args...)) }
	if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		bad("Namespace", "%q is not a valid namespace name", c.Namespace)
	}
	if msgs := validation.IsDNS1123Label(c.Env); len(msgs) > 0 {
		bad("Env", "%q must be a DNS label (lower case letters, digits and -): it is the labkeep.io/env label and part of students' home names", c.Env)
	}
	if c.DeadlineGrace < 0 {
		bad("DeadlineGrace", "must not be negative, got %s", c.DeadlineGrace)
	} else if c.MaxLifetime+c.DeadlineGrace <= 0 {
		bad("MaxLifetime", "%s + deadline grace %s must be positive", c.MaxLifetime, c.DeadlineGrace)
	}
	errs = append(errs,
		setting.AtLeast("AnchorBackoffLimit", c.AnchorBackoffLimit, 0),
		setting.AtLeast("AnchorCompletions", c.AnchorCompletions, 1),
		setting.Required("AnchorImage", c.AnchorImage),
		setting.Required("GuardianImage", c.GuardianImage),
		setting.Required("HomeReaderImage", c.HomeReaderImage),
		guardianWebhook(c.GuardianWebhookURL, c.WorkspaceKey),
		setting.Positive("CallTimeout", c.CallTimeout),
		setting.AtLeast("Burst", c.Burst, 1))
	if c.QPS <= 0 {
		bad("QPS", "must be positive, got %v", c.QPS)
	}
	pod, err := ParseWorkspacePod(c.WorkspacePod)
	if err != nil {
		bad("WorkspacePod", "%v", err)
	}
	if msgs := validation.IsDNS1123Label(c.PlatformNamespace); c.PlatformNamespace != "" && len(msgs) > 0 {
		bad("PlatformNamespace", "%q is not a valid namespace name", c.PlatformNamespace)
	}
	if len(c.SSHSourceCIDRs) == 0 {
		bad("SSHSourceCIDRs", "must name at least one range, or no student could reach a lab")
	}
	if _, err := parseClusterDNS(c.ClusterDNS); err != nil {
		bad("ClusterDNS", "%v", err)
	}
	for _, f := range []struct {
		field string
		cidrs []string
	}{{"SSHSourceCIDRs", c.SSHSourceCIDRs}, {"EgressBlockedCIDRs", c.EgressBlockedCIDRs}, {"PlatformSourceCIDRs", c.PlatformSourceCIDRs}} {
		for _, s := range f.cidrs {
			if p, err := netip.ParsePrefix(s); err != nil || p.Masked() != p {
				bad(f.field, "%q is not a CIDR with its host bits zero (like 10.0.0.0/8)", s)
			}
		}
	}
	return pod, errors.Join(errs...)
}

// dnsPods is ClusterDNS parsed: the DNS Pods' namespace and labels.
type dnsPods struct {
	namespace string
	labels    map[string]string
}

// parseClusterDNS parses "namespace/key=value[,key=value...]".
func parseClusterDNS(s string) (dnsPods, error) {
	ns, sel, ok := strings.Cut(s, "/")
	if !ok || ns == "" || sel == "" {
		return dnsPods{}, fmt.Errorf("%q is not namespace/key=value (like kube-system/k8s-app=kube-dns)", s)
	}
	if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
		return dnsPods{}, fmt.Errorf("%q is not a valid namespace name", ns)
	}
	d := dnsPods{namespace: ns, labels: map[string]string{}}
	for _, kv := range strings.Split(sel, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			return dnsPods{}, fmt.Errorf("%q is not a label key=value", kv)
		}
		d.labels[k] = v
	}
	return d, nil
}

// linkLocal is always blocked: the cloud metadata service (169.254.169.254)
// hands out node credentials, and nothing a lab needs lives there.
var linkLocal = []string{"169.254.0.0/16", "fe80::/10"}

// egressBlocked is every range a lab never reaches: link-local and
// EgressBlockedCIDRs.
func (c Config) egressBlocked() []string {
	return append(slices.Clip(linkLocal), c.EgressBlockedCIDRs...)
}

// Cluster implements session.Cluster against a real API server.
type Cluster struct {
	cfg  Config
	pod  *corev1.Pod
	kube kubernetes.Interface
	virt kubevirt.Interface
	// rc is the REST config NewForConfig was given (pods/exec needs it);
	// nil from New.
	rc *rest.Config
}

var (
	_ session.Cluster = (*Cluster)(nil)
	_ session.Homes   = (*Cluster)(nil)
	_ reap.Cluster    = (*Cluster)(nil)
	_ reap.VMCounter  = (*Cluster)(nil)
)

// New returns a Cluster using the given clients, or cfg.Validate's error.
func New(cfg Config, kube kubernetes.Interface, virt kubevirt.Interface) (*Cluster, error) {
	pod, err := cfg.validate()
	if err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	return &Cluster{cfg: cfg, pod: pod, kube: kube, virt: virt}, nil
}

// NewForConfig builds both clients from rc, with cfg's rate limits.
func NewForConfig(cfg Config, rc *rest.Config) (*Cluster, error) {
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = cfg.QPS, cfg.Burst
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	vc, err := kubevirt.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	c, err := New(cfg, kc, vc)
	if err != nil {
		return nil, err
	}
	c.rc = rc
	return c, nil
}

func (c *Cluster) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.cfg.CallTimeout)
}

// CountVMs implements session.Cluster: one list of every VirtualMachine in
// the namespace, labelled or not.
func (c *Cluster) CountVMs(ctx context.Context) (int, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	list, err := c.virt.KubevirtV1().VirtualMachines(c.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("listing VirtualMachines: %w", err)
	}
	return len(list.Items), nil
}

// CountWorkspacePods implements session.Cluster: one list of every Pod in
// the namespace, counting those with a deadline that have not finished —
// what a ResourceQuota with scope Terminating counts. labkeep's workspace
// Pods carry the session's deadline; its anchor Jobs' Pods (the deadline
// is the Job's) and KubeVirt's virt-launcher Pods have none.
func (c *Cluster) CountWorkspacePods(ctx context.Context) (int, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	list, err := c.kube.CoreV1().Pods(c.cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("listing Pods: %w", err)
	}
	n := 0
	for _, p := range list.Items {
		if p.Spec.ActiveDeadlineSeconds != nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			n++
		}
	}
	return n, nil
}

// Provision implements session.Cluster. Order: anchor Job (everything else
// is owned by it), per-node cloud-init Secrets (and, for the VMs of a
// session without a student key yet, keys Secrets holding the platform's
// keys: credentials.go), the session's NetworkPolicy (before any node
// starts, so no node is ever unconfined), then for VM labs the Service of
// a multi-node session and the VMs; for pod labs the workspace.
func (c *Cluster) Provision(ctx context.Context, s session.Session, lab labs.Lab) error {
	b := builder{cfg: c.cfg, sess: s, lab: lab, pod: c.pod, liveKeys: liveKeys(s, lab)}
	if lab.Home != nil {
		// First: the home is the student's, not the session's, and a
		// session never runs without it. A warm-pool instance has no
		// student yet, so it has no home either.
		if s.Student == "" || s.Pool != "" {
			return fmt.Errorf("lab %s keeps a home: a warm-pool instance, made before its student is known, cannot hold one", lab.Name)
		}
		if err := c.ensureHome(ctx, b); err != nil {
			return err
		}
	}
	anchor, err := create(ctx, c, "anchor Job", b.anchor(), c.kube.BatchV1().Jobs(c.cfg.Namespace).Create)
	if err != nil {
		return err
	}
	for _, n := range lab.Nodes {
		if _, err := create(ctx, c, "cloud-init Secret "+n.Name, b.cloudInit(n, anchor), c.kube.CoreV1().Secrets(c.cfg.Namespace).Create); err != nil {
			return err
		}
		if b.liveKeys {
			if _, err := create(ctx, c, "SSH keys Secret "+n.Name, b.sshKeys(n, anchor, c.cfg.PlatformSSHKeys), c.kube.CoreV1().Secrets(c.cfg.Namespace).Create); err != nil {
				return err
			}
		}
	}
	if _, err := create(ctx, c, "NetworkPolicy", b.networkPolicy(anchor), c.kube.NetworkingV1().NetworkPolicies(c.cfg.Namespace).Create); err != nil {
		return err
	}
	if lab.Kind == labs.KindPod {
		pod, err := b.workspace(anchor)
		if err != nil {
			return err
		}
		_, err = create(ctx, c, "workspace Pod", pod, c.kube.CoreV1().Pods(c.cfg.Namespace).Create)
		return err
	}
	if b.multiNode() {
		if _, err := create(ctx, c, "Service", b.service(anchor), c.kube.CoreV1().Services(c.cfg.Namespace).Create); err != nil {
			return err
		}
	}
	for _, n := range lab.Nodes {
		if _, err := create(ctx, c, "VirtualMachine "+n.Name, b.vm(n, anchor), c.virt.KubevirtV1().VirtualMachines(c.cfg.Namespace).Create); err != nil {
			return err
		}
	}
	return nil
}

func create[T any](ctx context.Context, c *Cluster, what string, obj T, fn func(context.Context, T, metav1.CreateOptions) (T, error)) (T, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	out, err := fn(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		if isQuotaRefusal(err) {
			return out, fmt.Errorf("%w: creating %s: %w", session.ErrNoCapacity, what, err)
		}
		return out, fmt.Errorf("creating %s: %w", what, err)
	}
	return out, nil
}

// isQuotaRefusal recognises the ResourceQuota admission error, the
// backstop when the VM count could not be read or was raced.
func isQuotaRefusal(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota")
}

// Observe implements session.Cluster: one get per node (a VMI for VM
// labs, the Pod for pod labs).
func (c *Cluster) Observe(ctx context.Context, s session.Session) ([]session.NodeState, error) {
	states := make([]session.NodeState, 0, len(s.Nodes))
	for _, n := range s.Nodes {
		st := session.NodeState{Name: n.Name}
		cctx, cancel := c.call(ctx)
		name := session.NodeName(s.ID, n.Name)
		if s.Kind == labs.KindPod {
			pod, err := c.kube.CoreV1().Pods(c.cfg.Namespace).Get(cctx, name, metav1.GetOptions{})
			cancel()
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return nil, fmt.Errorf("reading Pod %s: %w", name, err)
			default:
				st = PodState(n.Name, pod)
			}
		} else {
			vmi, err := c.virt.KubevirtV1().VirtualMachineInstances(c.cfg.Namespace).Get(cctx, name, metav1.GetOptions{})
			cancel()
			switch {
			case apierrors.IsNotFound(err):
				// Either not created yet by virt-controller, or gone; the
				// VM tells which.
				cctx, cancel := c.call(ctx)
				_, verr := c.virt.KubevirtV1().VirtualMachines(c.cfg.Namespace).Get(cctx, name, metav1.GetOptions{})
				cancel()
				if verr != nil && !apierrors.IsNotFound(verr) {
					return nil, fmt.Errorf("reading VirtualMachine %s: %w", name, verr)
				}
				st.Exists = verr == nil
			case err != nil:
				return nil, fmt.Errorf("reading VirtualMachineInstance %s: %w", name, err)
			default:
				st = VMIState(n.Name, vmi)
			}
		}
		states = append(states, st)
	}
	return states, nil
}

// VMIState derives a node's state from its VMI: ready when Running with
// condition Ready=True; the ready time is that condition's transition time.
// virt-controller copies its virt-launcher Pod's PodScheduled=False
// condition to the VMI, whose message says why it cannot be placed.
func VMIState(node string, vmi *kubevirtv1.VirtualMachineInstance) session.NodeState {
	st := session.NodeState{Name: node, Exists: vmi.DeletionTimestamp == nil}
	for _, c := range vmi.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineInstanceConditionType(corev1.PodScheduled) && c.Status == corev1.ConditionFalse {
			st.Unschedulable = unschedulable(c.Reason, c.Message)
		}
	}
	if vmi.Status.Phase == kubevirtv1.Running {
		for _, c := range vmi.Status.Conditions {
			if c.Type == kubevirtv1.VirtualMachineInstanceReady && c.Status == corev1.ConditionTrue {
				st.Ready, st.ReadyAt = true, c.LastTransitionTime.Time
			}
		}
	}
	for _, i := range vmi.Status.Interfaces {
		if i.IP != "" {
			st.Host = i.IP
			break
		}
	}
	return st
}

// PodState derives a workspace node's state from its Pod; the scheduler's
// PodScheduled=False condition says why it cannot be placed.
func PodState(node string, pod *corev1.Pod) session.NodeState {
	st := session.NodeState{Name: node, Exists: pod.DeletionTimestamp == nil, Host: pod.Status.PodIP}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			st.Unschedulable = unschedulable(c.Reason, c.Message)
		}
	}
	if pod.Status.Phase == corev1.PodRunning {
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				st.Ready, st.ReadyAt = true, c.LastTransitionTime.Time
			}
		}
	}
	return st
}

// unschedulable is the reason a PodScheduled=False condition gives: its
// message (the scheduler's account, node by node), else its reason, else a
// plain statement, so a node held back never reads as merely scheduled.
func unschedulable(reason, message string) string {
	switch {
	case strings.TrimSpace(message) != "":
		return strings.TrimSpace(message)
	case reason != "":
		return reason
	}
	return "the cluster has not placed it yet"
}
