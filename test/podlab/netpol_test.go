package podlab_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/netpolicy"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// Every session's network is confined by its own NetworkPolicy, which the
// real API server accepts as built: a Pod lab's and a single-VM lab's
// policy each select exactly that session's Pods that carry traffic (the
// workspace Pod; the virt-launcher Pod virtsim runs on the node with the
// VMI's labels), deny by default, and let in only SSH on the lab's port
// (and a workspace's guardian API from the platform's namespace); closing
// a session deletes its policy.
//
// Enforcement: the node's bridge CNI enforces no NetworkPolicy, so the test
// first shows what a lab reaches without an engine — from inside alice's
// workspace, bob's SSH, bob's guardian API, and the functions and the
// database published on the host's address on the node's link — then runs
// kube-network-policies for the node and checks that the same probes fail
// while alice's own SSH still works. Where the kernel refuses the engine,
// the enforcement subtest is skipped with the engine's own words.
func TestSessionNetworkIsConfined(t *testing.T) {
	// Two workspaces and a launcher Pod share the node's two CPUs.
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: `labs:
- name: shell
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  nodes: [{role: workspace, cpu: 300m, memory: 512Mi}]
- name: linux-vm
  kind: vm
  nodes: [{role: vm, cpu: "1", memory: 1Gi}]
  disk: {containerDisk: quay.io/containerdisks/fedora:41}
`})
	ctx := context.Background()
	alice := openLab(t, d, "alice", "shell", nil)
	bob := openLab(t, d, "bob", "shell", nil)
	vm := d.Opened("carol", "linux-vm")
	alice.waitRunning(3 * time.Minute)
	bob.waitRunning(3 * time.Minute)
	d.WaitRunning("carol", 3*time.Minute)
	alice.waitSSH(time.Minute)
	bob.waitSSH(time.Minute)

	policy := func(id string) *networkingv1.NetworkPolicy {
		np, err := d.Kube.NetworkingV1().NetworkPolicies(d.Namespace).Get(ctx, session.NetworkName(id), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the NetworkPolicy of session %s: %v", id, err)
		}
		return np
	}
	// virt-controller's stand-in creates the launcher Pod; wait until the
	// scheduler has put it on the node.
	var pods *corev1.PodList
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		var err error
		if pods, err = d.Kube.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{}); err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.Labels[kube.LabelSession] == vm.ID && kube.IsVirtLauncher(p.ObjectMeta) && p.Spec.NodeName == st.Node.Name {
				return true, ""
			}
		}
		return false, "no virt-launcher Pod of carol's VM on the node yet"
	})
	t.Run("each session's policy selects exactly its own Pods", func(t *testing.T) {
		launcher := ""
		for id, wantPort := range map[string]int32{alice.opened.ID: int32(alice.running.Nodes[0].SSH.Port), vm.ID: 22} {
			np := policy(id)
			if own := np.OwnerReferences; len(own) != 1 || own[0].Name != session.AnchorName(id) {
				t.Errorf("policy of %s owned by %+v, want the anchor", id, own)
			}
			if got := np.Spec.PolicyTypes; len(got) != 2 {
				t.Errorf("policy of %s has policy types %v, want Ingress and Egress", id, got)
			}
			in := np.Spec.Ingress
			if len(in) == 0 || len(in[0].Ports) != 1 || in[0].Ports[0].Port.IntVal != wantPort {
				t.Errorf("policy of %s lets in %+v, want SSH on %d first", id, in, wantPort)
			}
			// Beside SSH, only a workspace's guardian API, only from the platform's namespace.
			wantRules := 1
			if id == alice.opened.ID {
				wantRules = 2
				if len(in) < 2 || len(in[1].From) != 1 || in[1].From[0].NamespaceSelector == nil || in[1].From[0].PodSelector != nil ||
					len(in[1].Ports) != 1 || in[1].Ports[0].Port.StrVal != labs.GuardianAPIPort {
					t.Errorf("policy of %s lets in %+v, want guardian's API from the platform's namespace second", id, in)
				}
			}
			if len(in) != wantRules {
				t.Errorf("policy of %s has %d ingress rules, want %d", id, len(in), wantRules)
			}
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil {
				t.Fatal(err)
			}
			var selected []string
			for _, p := range pods.Items {
				if sel.Matches(labels.Set(p.Labels)) {
					selected = append(selected, p.Name)
					if id == vm.ID && kube.IsVirtLauncher(p.ObjectMeta) && p.Spec.NodeName == st.Node.Name {
						launcher = p.Name
					}
				}
			}
			want := alice.podName()
			if id == vm.ID {
				want = launcher
			}
			if len(selected) != 1 || selected[0] != want || want == "" {
				t.Errorf("policy of %s selects %v, want only its node's Pod %q", id, selected, want)
			}
		}
		t.Logf("alice's policy selects her workspace Pod %s; carol's selects her VM's virt-launcher Pod %s (labels copied from the VMI)", alice.podName(), launcher)
	})

	host := st.Node.HostIP
	functions := publish(t, host, "tcp", strings.TrimPrefix(d.Server.URL, "http://"))
	database := publish(t, host, "unix", filepath.Join(st.PG.Dir(), ".s.PGSQL.5432"))
	targets := []struct{ name, addr string }{
		{"bob's SSH", bob.addr()},
		{"bob's guardian API", net.JoinHostPort(bob.pod().Status.PodIP, "9090")},
		{"the functions", functions},
		{"the database", database},
	}
	probe := func(addr string) bool {
		h, p, _ := net.SplitHostPort(addr)
		out := alice.mustRun(fmt.Sprintf("timeout 3 bash -c 'echo > /dev/tcp/%s/%s' 2>/dev/null && echo open || echo closed", h, p))
		return strings.TrimSpace(out) == "open"
	}
	var baseline []string
	for _, tg := range targets {
		if !probe(tg.addr) {
			t.Fatalf("without an engine, %s (%s) is not reachable from alice's workspace: the probe shows nothing", tg.name, tg.addr)
		}
		baseline = append(baseline, tg.name)
	}
	t.Logf("without a NetworkPolicy engine (the node's bridge CNI enforces none), alice's workspace reaches %s", strings.Join(baseline, ", "))

	t.Run("enforced by kube-network-policies", func(t *testing.T) {
		engine := startEngine(t, ctx)
		for _, tg := range targets {
			stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
				return !probe(tg.addr), fmt.Sprintf("%s (%s) still reachable from alice's workspace", tg.name, tg.addr)
			})
		}
		if _, err := alice.run("true", nil); err != nil {
			t.Errorf("alice's own SSH under the engine: %v\nengine log:\n%s", err, engine)
		}
	})

	alice.close()
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		_, err := d.Kube.NetworkingV1().NetworkPolicies(d.Namespace).Get(ctx, session.NetworkName(alice.opened.ID), metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("alice's NetworkPolicy after her close: %v", err)
	})
	for _, who := range []string{"bob", "carol"} {
		if r := d.Close(who); r.Status != 200 {
			t.Errorf("close of %s: %d %s", who, r.Status, r.Body)
		}
	}
	d.WaitNoObjects()
}

// startEngine runs kube-network-policies for the node as a ServiceAccount
// allowed to watch what it needs, and returns its log path; it skips t,
// with the engine's own words, where the kernel refuses the engine.
func startEngine(t *testing.T, ctx context.Context) string {
	t.Helper()
	cache, err := controlplane.DefaultCacheDir("")
	if err != nil {
		t.Fatal(err)
	}
	bin, err := netpolicy.EnsureEngine(ctx, cache, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	const ns, name = "kube-system", "kube-network-policies"
	rc, err := st.CP.ServiceAccountConfig(ctx, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	admin, _ := stacktest.AdminClients(t, st)
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces", "nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "watch"}},
	}}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: name}}}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	e, err := netpolicy.Start(ctx, netpolicy.Options{Binary: bin, API: rc, NodeName: st.Node.Name, Dir: t.TempDir(), Wait: time.Minute})
	if errors.Is(err, netpolicy.ErrUnsupported) {
		t.Skipf("enforcement cannot be shown on this machine: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e.Log
}

// publish forwards a TCP port on the host's address on the node's link to target
// (network "tcp" or "unix"), as an in-cluster Service would make the
// functions or the database reachable from Pods; it returns the address.
func publish(t *testing.T, host, network, target string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				u, err := net.DialTimeout(network, target, 3*time.Second)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return l.Addr().String()
}
