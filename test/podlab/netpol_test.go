package podlab_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/localrun/node"
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
// (and a workspace's guardian API from the platform); closing a session
// deletes its policy.
//
// Enforcement is shown by trying traffic, with the node's NetworkPolicy
// engine (kube-router's controller, localrun/node): from inside alice's
// workspace, as root, bob's SSH and guardian API, the functions and the
// database (published on the host), the API server (its Service and its
// relay on the node), a listener on the node's address, a stand-in for a
// cloud's metadata service and one for an outside resolver's DNS all
// refuse her, while the cluster DNS answers her and her own SSH works from
// the host. A control Pod in a namespace without policies reaches every
// one of those targets, so each refusal is the policy's, not a dead
// address.
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
			// Beside SSH, only a workspace's guardian API (by number: 9090),
			// only from the platform: its namespace, and the host the local
			// stack's functions run on.
			wantRules := 1
			if id == alice.opened.ID {
				wantRules = 2
				if len(in) < 2 || len(in[1].From) != 2 || in[1].From[0].NamespaceSelector == nil || in[1].From[0].PodSelector != nil ||
					in[1].From[1].IPBlock == nil || in[1].From[1].IPBlock.CIDR != st.Node.HostSource() ||
					len(in[1].Ports) != 1 || in[1].Ports[0].Port.IntVal != 9090 {
					t.Errorf("policy of %s lets in %+v, want guardian's API from the platform second", id, in)
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
	nodeService := serveOnNode(t, net.JoinHostPort(st.Node.IP, "0"))
	metadata := serveOnNode(t, "169.254.169.254:80")
	resolver := serveOnNode(t, "192.0.2.53:53")
	apiPort := strings.TrimPrefix(st.CP.APIServerURL, "https://127.0.0.1:")
	gateway := netip.MustParsePrefix(st.Node.PodCIDR).Addr().Next().String()
	// fromHost: bob's own policy admits no Pod, so the host (a permitted
	// SSH and platform source here) shows his ports answer; every other
	// target is shown live from a Pod without any policy.
	targets := []struct {
		name, addr string
		fromHost   bool
	}{
		{"bob's SSH", bob.addr(), true},
		{"bob's guardian API", net.JoinHostPort(bob.pod().Status.PodIP, "9090"), true},
		{"the functions", functions, false},
		{"the database", database, false},
		{"the API server's Service", "10.0.0.1:443", false},
		{"the API server's relay on the node", net.JoinHostPort(gateway, apiPort), false},
		{"a service on the node's address", nodeService, false},
		{"the metadata service's address", metadata, false},
		{"an outside resolver's DNS port", resolver, false},
	}
	probe := "timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>/dev/null && echo open || echo closed"
	control := controlPod(t, d)
	for _, tg := range targets {
		if tg.fromHost {
			c, err := net.DialTimeout("tcp", tg.addr, 3*time.Second)
			if err != nil {
				t.Fatalf("the host cannot reach %s (%s): %v; the probe from alice would prove nothing", tg.name, tg.addr, err)
			}
			c.Close()
			continue
		}
		h, p, _ := net.SplitHostPort(tg.addr)
		if out := control.run(t, fmt.Sprintf(probe, h, p)); out != "open" {
			t.Fatalf("the control Pod (no policy) cannot reach %s (%s): %q; the probe from alice would prove nothing", tg.name, tg.addr, out)
		}
	}
	t.Run("a workspace reaches nothing of the cluster or the platform", func(t *testing.T) {
		for _, tg := range targets {
			h, p, _ := net.SplitHostPort(tg.addr)
			if out := strings.TrimSpace(alice.mustRun(fmt.Sprintf(probe, h, p))); out != "closed" {
				t.Errorf("alice's workspace reaches %s (%s): %q", tg.name, tg.addr, out)
			}
		}
	})
	t.Run("the cluster DNS answers a workspace", func(t *testing.T) {
		if out := strings.TrimSpace(alice.mustRun("getent hosts kubernetes.default.svc.cluster.local | cut -d' ' -f1")); out != "10.0.0.1" {
			t.Errorf("alice's workspace resolves kubernetes.default.svc.cluster.local to %q, want 10.0.0.1", out)
		}
	})
	t.Run("the student's SSH works from the host", func(t *testing.T) {
		if _, err := alice.run("true", nil); err != nil {
			t.Errorf("alice's own SSH: %v", err)
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
				// Whichever side ends first ends both: a probe that only
				// opens and closes must not keep the relay (and the
				// test's cleanup) waiting on a server that never speaks.
				go func() { _, _ = io.Copy(u, c); u.Close() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return l.Addr().String()
}

// serveOnNode accepts TCP connections at addr in the node's network
// namespace (adding the address to the node first unless it is the
// node's own), answering each with a line: a service on the node, as its
// Pods see it. It returns the address.
func serveOnNode(t *testing.T, addr string) string {
	t.Helper()
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	if h != st.Node.IP {
		if err := st.Node.AddLocalAddress(h); err != nil {
			t.Fatal(err)
		}
	}
	l, err := st.Node.Listen(addr)
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
			_, _ = io.WriteString(c, "hello\n")
			c.Close()
		}
	}()
	return l.Addr().String()
}

// podShell is a Pod a test runs shell commands in through the API server.
type podShell struct {
	d    *stacktest.Deployment
	ns   string
	name string
}

// controlPod starts a workspace-image Pod in a namespace of its own with
// no NetworkPolicy: what any Pod reaches on the node without confinement.
func controlPod(t *testing.T, d *stacktest.Deployment) podShell {
	t.Helper()
	ctx := context.Background()
	ns := "netcheck-" + d.Env
	if _, err := d.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	one := int64(1)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "control", Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &one,
			Containers:                    []corev1.Container{{Name: labs.WorkspaceContainer, Image: node.WorkspaceImage, Command: []string{"sleep", "infinity"}}},
		},
	}
	if _, err := d.Kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		got, err := d.Kube.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning, fmt.Sprintf("control Pod not running (%v)", err)
	})
	return podShell{d: d, ns: ns, name: p.Name}
}

// run runs script with bash in the Pod and returns its trimmed standard
// output.
func (p podShell) run(t *testing.T, script string) string {
	t.Helper()
	ex, err := kube.WorkspaceExecutor(st.CP.Admin, p.d.Kube, p.ns, p.name, corev1.PodExecOptions{Command: []string{"bash", "-c", script}, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := ex.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut}); err != nil {
		t.Fatalf("%q in the control Pod: %v: %s%s", script, err, out.String(), errOut.String())
	}
	return strings.TrimSpace(out.String())
}
