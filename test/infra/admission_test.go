package infra_test

import (
	"context"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"labkeep/infra"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/seating"
	"labkeep/shared/session"
	"labkeep/shared/workspacekey"
)

// The policy's messages, as admission-policy.yaml writes them (the start
// of each, enough to tell the rules apart).
const (
	refusedNoEnvironment = "namespace has no environment (env.<namespace>)"
	refusedLabels        = "missing or foreign labels"
	refusedVMLabels      = "a VirtualMachine's template and disk templates must carry"
	refusedImage         = "an image is not in the allowlist"
	refusedHost          = "must not share the node's network, PID or IPC namespace"
	refusedToken         = "must set automountServiceAccountToken: false"
	refusedVolume        = "a volume is not allowed"
	refusedEscalation    = "every container must set allowPrivilegeEscalation: false and none may be privileged"
	refusedCapabilities  = "every container must drop ALL capabilities"
	refusedSeccomp       = "must run under the RuntimeDefault or a Localhost seccomp profile"
	refusedSecretType    = "a Secret must be of type Opaque"
	refusedService       = "a Service must be of type ClusterIP"
	refusedExec          = "the functions may exec only into a workspace Pod's workspace container"
	refusedGuardian      = "the container named guardian must be an init container running an image of guardianImages"
)

var (
	podsGVR    = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	jobsGVR    = schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}
	secretsGVR = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	svcGVR     = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	vmGVR      = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
)

// The admission policy's parameters agree with the code: the workspace set
// plus the labs' opt-ins, guardian's capabilities as the workspace Pod
// definition gives them, the cluster's DNS Pods as the functions' default
// LABKEEP_CLUSTER_DNS, anchor images admitting the default
// LABKEEP_ANCHOR_IMAGE; images named by repository or by a prefix ending
// in "/" (so "ghcr.io/labkeep" could never admit "ghcr.io/labkeepevil/…"),
// guardian's and the anchor's by repository or repository@digest, and
// guardian's webhooks by address:port or *.
func TestAdmissionParamsMatchTheCode(t *testing.T) {
	params := admissionParams(t, infra.Placement{})
	words := func(key string) []string {
		w := strings.Fields(params.Data[key])
		slices.Sort(w)
		return w
	}
	pod, err := kube.ParseWorkspacePod(nil)
	if err != nil {
		t.Fatal(err)
	}
	var wantWorkspace, wantGuardian []string
	for _, c := range kube.WorkspaceCapabilities {
		wantWorkspace = append(wantWorkspace, string(c))
	}
	wantWorkspace = append(wantWorkspace, labs.OptInCapabilities...)
	for _, c := range pod.Spec.InitContainers[0].SecurityContext.Capabilities.Add {
		wantGuardian = append(wantGuardian, string(c))
	}
	slices.Sort(wantWorkspace)
	slices.Sort(wantGuardian)
	defaults := kube.DefaultConfig()
	got := map[string][]string{"workspaceCapabilities": words("workspaceCapabilities"), "guardianCapabilities": words("guardianCapabilities"),
		"hostPaths": words("hostPaths"), "clusterDNS": words("clusterDNS")}
	want := map[string][]string{"workspaceCapabilities": wantWorkspace, "guardianCapabilities": wantGuardian,
		"hostPaths": {pod.Spec.Volumes[0].HostPath.Path}, "clusterDNS": {defaults.ClusterDNS}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("labkeep-admission parameters (-want +got):\n%s", diff)
	}
	for _, r := range words("images") {
		if strings.ContainsAny(r, ":@") {
			t.Errorf("images entry %q: name a repository (any tag or digest matches) or a prefix ending in /", r)
		}
	}
	for _, key := range []string{"guardianImages", "anchorImages"} {
		for _, r := range words(key) {
			repo, digest, pinned := strings.Cut(r, "@")
			if strings.Contains(repo, ":") || (pinned && !pinnedDigest.MatchString(digest)) {
				t.Errorf("%s entry %q: name a repository (any tag or digest matches) or a repository@sha256:<digest> (that image alone)", key, r)
			}
		}
	}
	// The anchor image the functions (and the local stack) run by default.
	if !slices.ContainsFunc(words("anchorImages"), func(r string) bool {
		return strings.HasPrefix(defaults.AnchorImage, r+":") || strings.HasPrefix(defaults.AnchorImage, r+"@")
	}) {
		t.Errorf("anchorImages %q do not admit the default anchor image %s", words("anchorImages"), defaults.AnchorImage)
	}
	for _, w := range words("guardianWebhooks") {
		if _, err := netip.ParseAddrPort(w); w != "*" && err != nil {
			t.Errorf("guardianWebhooks entry %q: name an address:port ([address]:port for IPv6) or *: %v", w, err)
		}
	}
}

// pinnedDigest is a digest a guardianImages entry may pin guardian's
// image to.
var pinnedDigest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// The functions' ServiceAccount, as the API server sees it (impersonated,
// with rbac.yaml's Role), under admission-policy.yaml: every object
// labkeep's own builder makes for the sample labs (anchor Job, Secrets,
// NetworkPolicy, workspace Pod, headless Service, VMs) is created for
// real, and objects shaped otherwise are refused with the policy's
// sentence for the rule they break. Each crafted object is one of
// labkeep's own, read back from the server, changed in one way, and
// created with dryRun=All (admission runs, nothing is stored). The same
// privileged Pod from another user is admitted: the policy confines the
// functions, not the cluster's controllers.
func TestFunctionsCreateOnlyLabkeepShapedObjects(t *testing.T) {
	ctx := context.Background()
	suffix := stacktest.Suffix()
	place := infra.Placement{Functions: "adm-fn-" + suffix, Sessions: "adm-vms-" + suffix}
	env := "adm-" + suffix
	unlisted := "adm-other-" + suffix // a functions namespace the ConfigMap does not name
	admin, err := kubernetes.NewForConfig(api.admin)
	if err != nil {
		t.Fatal(err)
	}
	createPlacement(t, admin, place, unlisted)
	// The same Role for the ServiceAccount of a namespace without an
	// environment, so only the policy stands in its way.
	if _, err := admin.RbacV1().RoleBindings(place.Sessions).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "unlisted"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: infra.ServiceAccount},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: infra.ServiceAccount, Namespace: unlisted}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	installAdmissionPolicy(t, place, env)
	awaitDefaultServiceAccount(t, admin, place.Sessions)

	fnRC := impersonate(place.Functions)
	fnDyn := dynamic.NewForConfigOrDie(fnRC)
	catalog := sampleLabs(t)
	golden, err := labs.Parse([]byte(`labs: [{name: golden, kind: vm, nodes: [{role: vm}, {role: worker, count: 2}],
  disk: {goldenPVC: {name: fedora, namespace: labkeep-golden, size: 20Gi}}}]`))
	if err != nil {
		t.Fatal(err)
	}
	goldenLab, _ := golden.Get("golden")

	// labkeep's own sessions, created by labkeep's own code as the
	// functions. The policy becomes active a moment after it is created
	// (the API server's informers), so the first session is retried until
	// a crafted Pod is refused.
	cfg := kube.DefaultConfig()
	cfg.Namespace, cfg.Env, cfg.MaxLifetime = place.Sessions, env, time.Hour
	cluster, err := kube.NewForConfig(cfg, fnRC)
	if err != nil {
		t.Fatal(err)
	}

	// Wait for the policy: a foreign image in labkeep's anchor Job.
	probe := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Labels: map[string]string{"labkeep.io/env": env}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "c", Image: "docker.io/library/busybox"}},
		}}},
	}
	awaitPolicy(t, fnDyn, jobsGVR, place.Sessions, probe, "labkeep admission")
	logTypeWarnings(t, admin)

	// Every sample lab, one cloning a golden PVC (dataVolumeTemplates) and
	// a shell lab opting in to NET_RAW.
	t.Run("labkeep's own objects are admitted", func(t *testing.T) {
		netLab, _ := catalog.Get("shell")
		netLab.Name, netLab.Capabilities = "shell-net", []string{"NET_RAW"}
		for _, lab := range append(labsOf(catalog), goldenLab, netLab) {
			t.Run(lab.Name, func(t *testing.T) { provisionOwn(t, cluster, studentSession(lab), lab) })
		}
	})

	// The baselines the crafted objects are made from: labkeep's own
	// workspace Pod, anchor Job and VM, read back.
	shellLab, _ := catalog.Get("shell")
	vmLab, _ := catalog.Get("linux-vm")
	podSession := provisionOwn(t, cluster, studentSession(shellLab), shellLab)
	vmSession := provisionOwn(t, cluster, studentSession(vmLab), vmLab)
	goldenSession := provisionOwn(t, cluster, studentSession(goldenLab), goldenLab)
	var workspace corev1.Pod
	var anchor batchv1.Job
	typed(t, stored(t, podsGVR, place.Sessions, session.NodeName(podSession.ID, shellLab.Nodes[0].Name)), &workspace)
	typed(t, stored(t, jobsGVR, place.Sessions, session.AnchorName(podSession.ID)), &anchor)
	vm := stored(t, vmGVR, place.Sessions, session.NodeName(vmSession.ID, vmLab.Nodes[0].Name))
	goldenVM := stored(t, vmGVR, place.Sessions, session.NodeName(goldenSession.ID, goldenLab.Nodes[0].Name))

	// The controllers are not the functions: the Job controller creates
	// the anchor's Pod, which carries no environment label.
	t.Run("the Job controller's anchor Pod is admitted", func(t *testing.T) {
		stacktest.Eventually(t, time.Minute, func() (bool, string) {
			pods, err := admin.CoreV1().Pods(place.Sessions).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelAnchorOf + "=" + podSession.ID})
			return err == nil && len(pods.Items) == 1, "no anchor Pod: " + errString(err)
		})
	})

	pod, job := podCopies(&workspace, "crafted"), jobCopies(&anchor, podSession.ID)
	virtualMachine, goldenVirtualMachine := vmCopies(vm, "crafted"), vmCopies(goldenVM, "crafted")
	labelsOf := func(edit func(map[string]string)) map[string]string {
		l := maps.Clone(workspace.Labels)
		edit(l)
		return l
	}
	hostRoot := corev1.Volume{Name: "host-root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}

	t.Run("exec", func(t *testing.T) { testExec(t, admin, place.Functions, place.Sessions, workspace.Name) })
	testAdmission(t, fnDyn, place.Sessions, []admissionCase{
		{"a privileged workspace container", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.SecurityContext.Privileged, ws.SecurityContext.AllowPrivilegeEscalation = ptr(true), nil
		}), refusedEscalation},
		{"a workspace allowed to escalate privileges", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.SecurityContext.AllowPrivilegeEscalation = ptr(true)
		}), refusedEscalation},
		{"the node's root filesystem mounted in the workspace", pod(func(p *corev1.Pod, ws, _ *corev1.Container) {
			p.Spec.Volumes = append(p.Spec.Volumes, hostRoot)
			ws.VolumeMounts = append(ws.VolumeMounts, corev1.VolumeMount{Name: "host-root", MountPath: "/host"})
		}), refusedVolume},
		{"guardian's cgroup hostPath mounted in the workspace", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.VolumeMounts = append(ws.VolumeMounts, corev1.VolumeMount{Name: "host-cgroup", MountPath: "/host/sys/fs/cgroup"})
		}), refusedVolume},
		{"guardian's powers under another image", pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			g.Image = "ghcr.io/labkeep/workspace:debian12"
		}), refusedGuardian},
		{"guardian's image running another command", pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			g.Command = []string{"/bin/sh", "-c", "cat /host/sys/fs/cgroup/*"}
		}), refusedGuardian},
		{"guardian asking for SYS_ADMIN", pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			g.SecurityContext.Capabilities.Add = append(g.SecurityContext.Capabilities.Add, "SYS_ADMIN")
		}), refusedCapabilities},
		{"a foreign image", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.Image = "docker.io/library/alpine:3.20"
		}), refusedImage},
		{"a lookalike of an allowed repository", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.Image = "registry.k8s.io/pause-miner:1"
		}), refusedImage},
		{"SYS_ADMIN for the workspace", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.SecurityContext.Capabilities.Add = append(ws.SecurityContext.Capabilities.Add, "SYS_ADMIN")
		}), refusedCapabilities},
		{"the runtime's default capabilities for the workspace", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.SecurityContext.Capabilities = nil
		}), refusedCapabilities},
		{"a workspace without seccomp", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}), refusedSeccomp},
		{"the node's network", pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.HostNetwork = true
		}), refusedHost},
		{"the node's PIDs", pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.HostPID, p.Spec.ShareProcessNamespace = true, nil
		}), refusedHost},
		{"a ServiceAccount token", pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.AutomountServiceAccountToken = ptr(true)
		}), refusedToken},
		{"no labels", pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Labels = nil
		}), refusedLabels},
		{"no session label", pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Labels = labelsOf(func(l map[string]string) { delete(l, kube.LabelSession) })
		}), refusedLabels},
		{"another environment's label", pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Labels = labelsOf(func(l map[string]string) { l[kube.LabelEnv] = "prod" })
		}), refusedLabels},
		{"a Job running a foreign image", job(func(spec *corev1.PodSpec) {
			spec.Containers[0].Image = "docker.io/library/busybox:1"
		}), refusedImage},
		{"a Job mounting the node's root filesystem", job(func(spec *corev1.PodSpec) {
			spec.Volumes = append(spec.Volumes, hostRoot)
			spec.Containers[0].VolumeMounts = append(spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "host-root", MountPath: "/host"})
		}), refusedVolume},
		{"a Job with the runtime's default capabilities", job(func(spec *corev1.PodSpec) {
			spec.Containers[0].SecurityContext.Capabilities = nil
		}), refusedCapabilities},
		{"a VM booting a foreign disk", virtualMachine(func(u *unstructured.Unstructured) {
			vols, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "volumes")
			for _, v := range vols {
				if cd, ok := v.(map[string]any)["containerDisk"].(map[string]any); ok {
					cd["image"] = "docker.io/evil/disk:1"
				}
			}
			_ = unstructured.SetNestedSlice(u.Object, vols, "spec", "template", "spec", "volumes")
		}), refusedImage},
		{"a VM whose instances carry another environment", virtualMachine(func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "prod", "spec", "template", "metadata", "labels", kube.LabelEnv)
		}), refusedVMLabels},
		{"a VM whose disk template carries another environment", goldenVirtualMachine(func(u *unstructured.Unstructured) {
			dvts, _, _ := unstructured.NestedSlice(u.Object, "spec", "dataVolumeTemplates")
			if len(dvts) != 1 {
				t.Fatalf("golden VM has %d dataVolumeTemplates, want 1", len(dvts))
			}
			_ = unstructured.SetNestedField(dvts[0].(map[string]any), "prod", "metadata", "labels", kube.LabelEnv)
			_ = unstructured.SetNestedSlice(u.Object, dvts, "spec", "dataVolumeTemplates")
		}), refusedVMLabels},
		{"a VM without labels", virtualMachine(func(u *unstructured.Unstructured) {
			u.SetLabels(nil)
		}), refusedLabels},
		{"a service-account-token Secret", crafted{secretsGVR, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "crafted", Labels: workspace.Labels,
				Annotations: map[string]string{corev1.ServiceAccountNameKey: "default"}},
			Type: corev1.SecretTypeServiceAccountToken,
		}}, refusedSecretType},
		{"an Opaque Secret with labkeep's labels", crafted{secretsGVR, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "crafted", Labels: workspace.Labels}, Type: corev1.SecretTypeOpaque,
		}}, ""},
		{"a NodePort Service", crafted{svcGVR, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "crafted", Labels: workspace.Labels},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{kube.LabelSession: podSession.ID},
				Ports: []corev1.ServicePort{{Name: "ssh", Port: 22}}},
		}}, refusedService},
	})
	testAdmission(t, dynamic.NewForConfigOrDie(impersonate(unlisted)), place.Sessions, []admissionCase{
		{"the functions of an environment the parameters do not name", pod(nil), refusedNoEnvironment},
	})
	testAdmission(t, api.dyn, place.Sessions, []admissionCase{
		{"control: the privileged Pod from the cluster's admin", pod(func(p *corev1.Pod, ws, _ *corev1.Container) {
			p.Spec.Volumes = append(p.Spec.Volumes, hostRoot)
			ws.SecurityContext.Privileged, ws.SecurityContext.AllowPrivilegeEscalation = ptr(true), nil
			ws.Image = "docker.io/library/alpine:3.20"
		}), ""},
	})
}

// The web terminal's exec into a workspace container passes the exec
// policy (and fails further on: no node runs the Pod here); exec into
// guardian and attach are refused, whatever RBAC grants (the test grants
// both itself, so only the policy stands in the way).
func testExec(t *testing.T, admin kubernetes.Interface, from, ns, pod string) {
	t.Helper()
	ctx := context.Background()
	rules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods/exec", "pods/attach"}, Verbs: []string{"create", "get"}}}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "exec"}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "exec"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "exec"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: infra.ServiceAccount, Namespace: from}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fn := kubernetes.NewForConfigOrDie(impersonate(from))
	tests := []struct {
		name, subresource, container, refused string
	}{
		{"exec into the workspace container", "exec", labs.WorkspaceContainer, ""},
		{"exec into a home reader's reader container", "exec", kube.ReaderContainer, ""},
		{"exec into guardian", "exec", "guardian", refusedExec},
		{"exec without naming a container", "exec", "", refusedExec},
		{"attach to the workspace container", "attach", labs.WorkspaceContainer, refusedExec},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			// RBAC settles in the authorizer's cache a moment after it is
			// created: retry while the refusal is RBAC's.
			stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
				err = fn.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(pod).SubResource(tc.subresource).
					VersionedParams(&corev1.PodExecOptions{Container: tc.container, Command: []string{"sh"}, Stdout: true}, scheme.ParameterCodec).
					Do(ctx).Error()
				return !strings.Contains(errString(err), "RBAC"), errString(err)
			})
			refusedByPolicy := apierrors.IsForbidden(err) && strings.Contains(err.Error(), "labkeep admission: ")
			switch {
			case tc.refused == "" && (err == nil || apierrors.IsForbidden(err)):
				t.Fatalf("%v; want it past admission and failing for want of a node", errString(err))
			case tc.refused != "" && !(refusedByPolicy && strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("%v; want the policy's %q", errString(err), tc.refused)
			}
			t.Log(err)
		})
	}
}

// applyInfra creates the named manifests' objects, placed per p, for real.
func applyInfra(t *testing.T, p infra.Placement, names ...string) {
	t.Helper()
	objs, err := infra.Objects(p, names...)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if err := api.apply(context.Background(), o, "", false); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// createPlacement creates the namespaces of p, deleted when t ends, and
// rbac.yaml's objects placed in them.
func createPlacement(t *testing.T, admin kubernetes.Interface, p infra.Placement, extra ...string) {
	t.Helper()
	for _, ns := range append([]string{p.Functions, p.Sessions}, extra...) {
		if _, err := admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	}
	applyInfra(t, p, "rbac.yaml")
}

// underAdmissionPolicy creates a test's own namespaces (prefix-fn-…,
// prefix-vms-…) with rbac.yaml and admission-policy.yaml, its environment
// prefix-…, and returns them with the admin's client and the config
// acting as that functions namespace's ServiceAccount.
func underAdmissionPolicy(t *testing.T, prefix string) (infra.Placement, string, kubernetes.Interface, *rest.Config) {
	t.Helper()
	return underAdmissionParams(t, prefix, nil)
}

// underAdmissionParams is underAdmissionPolicy with the parameters of data
// replacing the file's (infra.Admission's Data).
func underAdmissionParams(t *testing.T, prefix string, data map[string]string) (infra.Placement, string, kubernetes.Interface, *rest.Config) {
	t.Helper()
	suffix := stacktest.Suffix()
	place := infra.Placement{Functions: prefix + "-fn-" + suffix, Sessions: prefix + "-vms-" + suffix}
	env := prefix + "-" + suffix
	admin, err := kubernetes.NewForConfig(api.admin)
	if err != nil {
		t.Fatal(err)
	}
	createPlacement(t, admin, place)
	installAdmission(t, place, infra.Admission{Env: env, Data: data})
	return place, env, admin, impersonate(place.Functions)
}

// policyFixture is one placement under the admission policy whose
// functions are labkeep's own code (cluster), acting as the placement's
// ServiceAccount.
type policyFixture struct {
	place   infra.Placement
	env     string
	admin   kubernetes.Interface
	fnDyn   dynamic.Interface // the functions' ServiceAccount, for crafted objects
	cluster *kube.Cluster
}

// newPolicyFixture sets up a policyFixture under the parameters data (nil:
// the file's) and waits for the policy. The functions run with
// kube.DefaultConfig in the placement, with a workspace key (guardian's
// cleanup token and alert credentials), changed by configure (nil: not).
func newPolicyFixture(t *testing.T, prefix string, data map[string]string, configure func(cfg *kube.Config)) *policyFixture {
	t.Helper()
	place, env, admin, fnRC := underAdmissionParams(t, prefix, data)
	f := &policyFixture{place: place, env: env, admin: admin, fnDyn: dynamic.NewForConfigOrDie(fnRC)}
	cfg := kube.DefaultConfig()
	cfg.Namespace, cfg.Env, cfg.MaxLifetime = place.Sessions, env, time.Hour
	cfg.WorkspaceKey = workspacekey.Key{Secret: []byte("workspace key"), Env: env}
	if configure != nil {
		configure(&cfg)
	}
	var err error
	if f.cluster, err = kube.NewForConfig(cfg, fnRC); err != nil {
		t.Fatal(err)
	}
	awaitDefaultServiceAccount(t, admin, place.Sessions)
	// The policy is active a moment after it is created: wait until it
	// refuses a Secret without labkeep's labels.
	probe := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Type: corev1.SecretTypeOpaque}
	awaitPolicy(t, f.fnDyn, secretsGVR, place.Sessions, probe, refusedLabels)
	return f
}

// ownSession provisions a session of the sample lab named lab with
// labkeep's own code, as the functions, and returns it with the lab.
func (f *policyFixture) ownSession(t *testing.T, lab string) (session.Session, labs.Lab) {
	t.Helper()
	l, ok := sampleLabs(t).Get(lab)
	if !ok {
		t.Fatalf("infra/base/labs.yaml has no %s lab", lab)
	}
	return provisionOwn(t, f.cluster, studentSession(l), l), l
}

// awaitPolicy waits until the policy, active a moment after it is
// created (the API server's informers), refuses probe (a dry-run create
// in ns by c) with a message containing refused.
func awaitPolicy(t *testing.T, c dynamic.Interface, gvr schema.GroupVersionResource, ns string, probe runtime.Object, refused string) {
	t.Helper()
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		err := dryRunCreate(context.Background(), c, gvr, ns, probe)
		return err != nil && strings.Contains(err.Error(), refused), "the policy does not refuse yet: " + errString(err)
	})
}

// crafted is an object for a test to create: gvr names its resource.
type crafted struct {
	gvr schema.GroupVersionResource
	obj runtime.Object
}

// admissionCase is one behaviour of the admission policy: obj, one of
// labkeep's own objects (read back from the API server, or as labkeep's
// builder makes it) changed in one way, and the answer its create must
// get.
type admissionCase struct {
	name    string
	obj     crafted
	refused string // the rule's sentence; "" means admitted, nameTaken past the policy
}

// nameTaken, as an admissionCase's refused, wants the create past the
// policy and refused by the API server because the name is taken: a
// crafted object that takes another session's labels and Secrets must
// also take that session's object's name, which exists.
const nameTaken = "(past the policy; the name is taken)"

// testAdmission runs one subtest per case: c creates the case's object in
// ns with dryRun=All (admission runs, nothing is stored), and wantAdmission
// checks the answer. The objects are built before, so a builder's t.Fatal
// stops the whole table, not one case.
func testAdmission(t *testing.T, c dynamic.Interface, ns string, cases []admissionCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantAdmission(t, dryRunCreate(context.Background(), c, tc.obj.gvr, ns, tc.obj.obj), tc.refused)
		})
	}
}

// podCopies makes crafted Pods from from, labkeep's own workspace Pod as
// stored: each a fresh copy named name (restampPod) changed by edit, which
// gets the copy, its workspace container and guardian's. A nil edit leaves
// the copy as it is.
func podCopies(from *corev1.Pod, name string) func(edit func(p *corev1.Pod, ws, guardian *corev1.Container)) crafted {
	return func(edit func(p *corev1.Pod, ws, guardian *corev1.Container)) crafted {
		p := restampPod(from, name)
		if edit != nil {
			edit(p, &p.Spec.Containers[0], &p.Spec.InitContainers[0])
		}
		return crafted{podsGVR, p}
	}
}

// jobCopies makes crafted Jobs from anchor, labkeep's own anchor Job of
// session id as stored: each a fresh copy named "crafted", without the
// selector and template labels the Job controller sets (its own to set),
// whose Pod spec edit changes.
func jobCopies(anchor *batchv1.Job, id string) func(edit func(spec *corev1.PodSpec)) crafted {
	return func(edit func(spec *corev1.PodSpec)) crafted {
		j := anchor.DeepCopy()
		j.ObjectMeta = metav1.ObjectMeta{Name: "crafted", Labels: j.Labels}
		j.Status = batchv1.JobStatus{}
		j.Spec.Selector, j.Spec.ManualSelector = nil, nil
		j.Spec.Template.Labels = map[string]string{kube.LabelAnchorOf: id}
		edit(&j.Spec.Template.Spec)
		return crafted{jobsGVR, j}
	}
}

// vmCopies makes crafted VirtualMachines from from, one of labkeep's own
// VMs as stored: each a fresh copy named name (restamp) changed by edit.
// A nil edit leaves the copy as it is.
func vmCopies(from *unstructured.Unstructured, name string) func(edit func(u *unstructured.Unstructured)) crafted {
	return func(edit func(u *unstructured.Unstructured)) crafted {
		u := restamp(from, name)
		if edit != nil {
			edit(u)
		}
		return crafted{vmGVR, u}
	}
}

// provisionOwn creates s, a session of lab, with labkeep's own code
// through c, which acts as the functions: the policy must admit every
// object of it.
func provisionOwn(t *testing.T, c *kube.Cluster, s session.Session, lab labs.Lab) session.Session {
	t.Helper()
	if err := c.Provision(context.Background(), s, lab); err != nil {
		t.Fatalf("labkeep's own %s session for %s refused: %v", lab.Name, s.Student, err)
	}
	return s
}

// stored is the object name of resource gvr in ns as the API server
// stored it, read by the admin.
func stored(t *testing.T, gvr schema.GroupVersionResource, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := api.dyn.Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("labkeep's own %s %s: %v", gvr.Resource, name, err)
	}
	return u
}

// removeOwn deletes labkeep's own object name of resource gvr in ns and
// waits until it is gone. Crafted copies that keep its name (the policy
// ties a name to the Secrets and disks it may use) can then pass
// admission and the dry run both.
func removeOwn(t *testing.T, gvr schema.GroupVersionResource, ns, name string) {
	t.Helper()
	ctx := context.Background()
	r := api.dyn.Resource(gvr).Namespace(ns)
	if err := r.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		_, err := r.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), gvr.Resource + " " + name + " still there: " + errString(err)
	})
}

// studentSession is a new session of lab for a student, with the keys
// and token labkeep issues (placeholders), as Provision takes it.
func studentSession(lab labs.Lab) session.Session {
	return session.Session{
		ID: uuid.NewString(), Student: "student@example.org", Lab: lab.Name, Kind: lab.Kind,
		StudentKey: "ssh-ed25519 AAAA student", HostKey: "ssh-ed25519 AAAA host", GradingToken: "token",
		Issued: session.Issued{HostPrivateKey: "-----BEGIN OPENSSH PRIVATE KEY-----\n-----END OPENSSH PRIVATE KEY-----\n"},
	}
}

// poolSession is a new warm-pool instance of lab as Provision takes it:
// studentSession's, owned by seating.PoolStudent and without a student
// key, so its VMs take their keys live.
func poolSession(lab labs.Lab) session.Session {
	s := studentSession(lab)
	s.Student, s.StudentKey = seating.PoolStudent, ""
	return s
}

// restamp is a copy of from, an object read back from the server, that
// can be created again: named name, with from's labels and nothing else
// of its metadata, and no status.
func restamp(from *unstructured.Unstructured, name string) *unstructured.Unstructured {
	u := from.DeepCopy()
	u.Object["metadata"] = map[string]any{"name": name}
	u.SetLabels(from.GetLabels())
	delete(u.Object, "status")
	return u
}

// restampPod is restamp for a typed Pod: a copy of from named name that
// keeps its labels and owners (a workspace Pod's anchor Job) and no
// other metadata, without status.
func restampPod(from *corev1.Pod, name string) *corev1.Pod {
	p := from.DeepCopy()
	p.ObjectMeta = metav1.ObjectMeta{Name: name, Labels: p.Labels, OwnerReferences: p.OwnerReferences}
	p.Status = corev1.PodStatus{}
	return p
}

// awaitDefaultServiceAccount waits until ns has its default
// ServiceAccount: Pods are admitted only once it exists.
func awaitDefaultServiceAccount(t *testing.T, admin kubernetes.Interface, ns string) {
	t.Helper()
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		_, err := admin.CoreV1().ServiceAccounts(ns).Get(context.Background(), "default", metav1.GetOptions{})
		return err == nil, "no default ServiceAccount yet in " + ns
	})
}

// wantAdmission fails t unless err, a create's outcome, is the one
// wanted: admitted when refused is "", past the policy and refused as
// existing when it is nameTaken, else refused by the labkeep policy with a
// message containing refused.
func wantAdmission(t *testing.T, err error, refused string) {
	t.Helper()
	switch {
	case refused == nameTaken:
		if !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%v; want past the policy and refused as already existing", errString(err))
		}
		t.Log(err)
	case refused == "" && err != nil:
		t.Fatalf("refused: %v", err)
	case refused != "" && err == nil:
		t.Fatalf("admitted; want refused with %q", refused)
	case refused != "" && !(apierrors.IsForbidden(err) && strings.Contains(err.Error(), "labkeep admission: ") && strings.Contains(err.Error(), refused)):
		t.Fatalf("refused with %v; want the policy's %q", err, refused)
	case err != nil:
		t.Log(err)
	}
}

// admissionParams is admission-policy.yaml's ConfigMap, placed per p.
func admissionParams(t *testing.T, p infra.Placement) *corev1.ConfigMap {
	t.Helper()
	objs, err := infra.Objects(p, "admission-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" {
			var cm corev1.ConfigMap
			typed(t, o, &cm)
			return &cm
		}
	}
	t.Fatal("admission-policy.yaml has no ConfigMap")
	return nil
}

// installAdmissionPolicy creates admission-policy.yaml's objects placed
// per p (infra.AdmissionObjects: the ConfigMap in p.Sessions naming env as
// the environment of p.Functions instead of the file's own, the bindings
// selecting p.Sessions and reading that ConfigMap). The cluster-scoped
// policies and bindings are deleted when t ends.
func installAdmissionPolicy(t *testing.T, p infra.Placement, env string) {
	t.Helper()
	installAdmission(t, p, infra.Admission{Env: env})
}

// installAdmission is installAdmissionPolicy with the parameters a.
func installAdmission(t *testing.T, p infra.Placement, a infra.Admission) {
	t.Helper()
	ctx := context.Background()
	objs, err := infra.AdmissionObjects(p, a)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if err := api.apply(ctx, o, "", false); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	deleteClusterScopedAtEnd(t, objs)
}

// deleteClusterScopedAtEnd deletes the cluster-scoped objects of objs
// (an admission policy and its bindings) when t ends; namespaced ones go
// with their namespace.
func deleteClusterScopedAtEnd(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if o.GetNamespace() != "" {
			continue
		}
		gvk := o.GroupVersionKind()
		m, err := api.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = api.dyn.Resource(m.Resource).Delete(context.Background(), o.GetName(), metav1.DeleteOptions{})
		})
	}
}

// logTypeWarnings logs what the API server's type check of the policy's
// expressions found (it checks them against the matched kinds' schemas).
func logTypeWarnings(t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	p, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(context.Background(), "labkeep-functions", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.TypeChecking != nil {
		for _, w := range p.Status.TypeChecking.ExpressionWarnings {
			t.Logf("type check of %s: %s", w.FieldRef, w.Warning)
		}
	}
}

// impersonate is the admin's config acting as the labkeep-functions
// ServiceAccount of namespace ns.
func impersonate(ns string) *rest.Config {
	rc := rest.CopyConfig(api.admin)
	rc.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + infra.ServiceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	return rc
}

// dryRunCreate creates obj in ns with dryRun=All.
func dryRunCreate(ctx context.Context, c dynamic.Interface, gvr schema.GroupVersionResource, ns string, obj runtime.Object) error {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return err
		}
		u = &unstructured.Unstructured{Object: m}
	}
	gvk := map[string]string{"pods": "Pod", "secrets": "Secret", "services": "Service", "jobs": "Job", "virtualmachines": "VirtualMachine",
		"networkpolicies": "NetworkPolicy"}[gvr.Resource]
	u.SetAPIVersion(gvr.GroupVersion().String())
	u.SetKind(gvk)
	u.SetNamespace(ns)
	_, err := c.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// sampleLabs is infra/base/labs.yaml.
func sampleLabs(t *testing.T) *labs.Catalog {
	t.Helper()
	data, err := infra.File("labs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := labs.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func labsOf(c *labs.Catalog) []labs.Lab {
	var out []labs.Lab
	for _, n := range c.Names() {
		l, _ := c.Get(n)
		out = append(out, l)
	}
	return out
}

func errString(err error) string {
	if err == nil {
		return "admitted"
	}
	return err.Error()
}

func ptr[T any](v T) *T { return &v }
