package podlab_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/node"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// Every session's network is confined by its own NetworkPolicy, which the
// real API server accepts as built: a Pod lab's and a VM lab's policy each
// select exactly that session's Pods that carry traffic (the workspace Pod;
// the virt-launcher Pods virtsim runs on the node with the VMIs' labels),
// deny by default, and let in only SSH on the lab's port (a workspace's
// guardian API from the platform; a multi-node lab's own machines); closing
// a session deletes its policy.
//
// Enforcement is shown by trying traffic, with the node's NetworkPolicy
// engine (kube-router's controller, localrun/node): from inside alice's
// workspace, as root with NET_RAW (her lab opts in), bob's SSH and guardian
// API, the functions and the database (published on the host), the API
// server (its Service and its relay on the node), a listener on the node's
// address, a stand-in for a cloud's metadata service and one for an outside
// resolver (DNS over TCP and a query over UDP) all refuse her, and so do
// ICMP echoes from a raw socket;
// the cluster DNS answers her, guardian's alert route is the one platform
// port she reaches (and it serves alerts only), and her own SSH works from
// the host. carol's two-machine VM lab's launcher Pods reach each other on
// every port tried and reach none of those targets. A Pod of no session in
// the sessions namespace (the namespace's default-deny of infra/base) reaches
// nothing, not even the cluster DNS, and nothing reaches it. A control Pod
// in a namespace without policies reaches every target, so each refusal is
// the policy's, not a dead address.
//
// virtsim's launcher Pods stand in for virt-launcher (a program answering
// on a guest's ports, localrun/images/launcher): the policy around them and
// the engine are real, a guest behind them is not.
func TestSessionNetworkIsConfined(t *testing.T) {
	// Two workspaces and two launcher Pods share the node's two CPUs.
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: `labs:
- name: net
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  capabilities: [NET_RAW]
  nodes: [{role: workspace, cpu: 300m, memory: 512Mi}]
- name: shell
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  nodes: [{role: workspace, cpu: 300m, memory: 512Mi}]
- name: cluster-vm
  kind: vm
  nodes: [{role: machine, count: 2, cpu: "1", memory: 1Gi}]
  disk: {containerDisk: quay.io/containerdisks/fedora:41}
`})
	ctx := context.Background()
	alice := openLab(t, d, "alice", "net", nil)
	bob := openLab(t, d, "bob", "shell", nil)
	vm := d.Opened("carol", "cluster-vm")
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
	// virt-controller's stand-in creates the launcher Pods; wait until both
	// run on the node with an address.
	var pods *corev1.PodList
	var launchers []corev1.Pod
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		var err error
		if pods, err = d.Kube.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{}); err != nil {
			return false, err.Error()
		}
		launchers = nil
		for _, p := range pods.Items {
			if p.Labels[kube.LabelSession] == vm.ID && kube.IsVirtLauncher(p.ObjectMeta) && p.Spec.NodeName == st.Node.Name &&
				p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				launchers = append(launchers, p)
			}
		}
		return len(launchers) == 2, fmt.Sprintf("%d of carol's 2 virt-launcher Pods running on the node", len(launchers))
	})
	t.Run("each session's policy selects exactly its own Pods", func(t *testing.T) {
		for _, tc := range []struct {
			who      string
			id       string
			sshPort  int32
			selected []string
			// Beside SSH: a workspace's guardian API (by number: 9090)
			// from the platform (its namespace, and the host the local
			// stack's functions run on); a multi-node lab's own machines.
			second func(in []networkingv1.NetworkPolicyIngressRule) bool
		}{
			{"alice", alice.opened.ID, int32(alice.running.Nodes[0].SSH.Port), []string{alice.podName()},
				func(in []networkingv1.NetworkPolicyIngressRule) bool {
					return len(in[1].From) == 2 && in[1].From[0].NamespaceSelector != nil && in[1].From[0].PodSelector == nil &&
						in[1].From[1].IPBlock != nil && in[1].From[1].IPBlock.CIDR == st.Node.HostSource() &&
						len(in[1].Ports) == 1 && in[1].Ports[0].Port.IntVal == 9090
				}},
			{"carol", vm.ID, 22, []string{launchers[0].Name, launchers[1].Name},
				func(in []networkingv1.NetworkPolicyIngressRule) bool {
					return len(in[1].From) == 1 && in[1].From[0].PodSelector != nil && in[1].From[0].NamespaceSelector == nil &&
						in[1].From[0].PodSelector.MatchLabels[kube.LabelSession] == vm.ID && len(in[1].Ports) == 0
				}},
		} {
			np := policy(tc.id)
			if own := np.OwnerReferences; len(own) != 1 || own[0].Name != session.AnchorName(tc.id) {
				t.Errorf("policy of %s owned by %+v, want the anchor", tc.who, own)
			}
			if got := np.Spec.PolicyTypes; len(got) != 2 {
				t.Errorf("policy of %s has policy types %v, want Ingress and Egress", tc.who, got)
			}
			in := np.Spec.Ingress
			if len(in) != 2 || len(in[0].Ports) != 1 || in[0].Ports[0].Port.IntVal != tc.sshPort || !tc.second(in) {
				t.Errorf("policy of %s lets in %+v, want SSH on %d, then its second rule", tc.who, in, tc.sshPort)
			}
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil {
				t.Fatal(err)
			}
			var selected []string
			for _, p := range pods.Items {
				if sel.Matches(labels.Set(p.Labels)) {
					selected = append(selected, p.Name)
				}
			}
			if diff := cmp.Diff(tc.selected, selected, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
				t.Errorf("policy of %s selects (-want +got):\n%s", tc.who, diff)
			}
		}
	})

	host := st.Node.HostIP
	functions := publish(t, host, "tcp", strings.TrimPrefix(d.Server.URL, "http://"))
	database := publish(t, host, "unix", filepath.Join(st.PG.Dir(), ".s.PGSQL.5432"))
	nodeService := serveOnNode(t, net.JoinHostPort(st.Node.IP, "0"))
	metadata := serveOnNode(t, "169.254.169.254:80")
	resolver := serveOnNode(t, "192.0.2.53:53")
	resolverUDP := "udp:" + echoOnNode(t, resolver)
	apiPort := strings.TrimPrefix(st.CP.APIServerURL, "https://127.0.0.1:")
	gateway := netip.MustParsePrefix(st.Node.PodCIDR).Addr().Next().String()
	// fromHost: bob's own policy admits no Pod, so the host (a permitted
	// SSH and platform source here) shows his ports answer; every other
	// target is shown live from a Pod without any policy. ICMP targets
	// (icmp:IP) are echoes from a raw socket.
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
		{"an outside resolver, a DNS query over UDP", resolverUDP, false},
		{"the node's address, by ICMP echo", "icmp:" + st.Node.IP, false},
		{"the Pods' gateway, by ICMP echo", "icmp:" + gateway, false},
	}
	// The launcher stand-in's program: its probe command tries TCP
	// connections, DNS queries over UDP and ICMP echoes from wherever it
	// runs.
	probeBin := stacktest.BuildStatic(t, "labkeep/localrun/images/launcher")
	control := controlPod(t, d)
	// Started now, probed later: its start overlaps the control's probes.
	stray := podIn(t, d, d.Namespace, "stray", node.VirtLauncherImage, "/launcher")
	control.upload(t, probeBin, "/tmp/probe")
	var fromPod []string
	for _, tg := range targets {
		if !tg.fromHost {
			fromPod = append(fromPod, tg.addr)
			continue
		}
		c, err := net.DialTimeout("tcp", tg.addr, 3*time.Second)
		if err != nil {
			t.Fatalf("the host cannot reach %s (%s): %v; the probe from alice would prove nothing", tg.name, tg.addr, err)
		}
		c.Close()
	}
	for addr, state := range probeResults(t, control.run(t, "/tmp/probe", append([]string{"probe"}, fromPod...)...)) {
		if state != "open" {
			t.Fatalf("the control Pod (no policy) cannot reach %s: %s; the probe from alice would prove nothing", addr, state)
		}
	}
	all := make([]string, 0, len(targets))
	for _, tg := range targets {
		all = append(all, tg.addr)
	}
	wantClosed := func(t *testing.T, who string, got map[string]string) {
		t.Helper()
		for _, tg := range targets {
			if got[tg.addr] != "closed" {
				t.Errorf("%s reaches %s (%s): %q", who, tg.name, tg.addr, got[tg.addr])
			}
		}
	}
	t.Run("a workspace reaches nothing of the cluster or the platform", func(t *testing.T) {
		alice.upload(probeBin, "/root/probe")
		wantClosed(t, "alice's workspace", probeResults(t, alice.mustRun("/root/probe probe "+strings.Join(all, " "))))
	})
	t.Run("guardian's alert route is the one platform port a workspace reaches, and serves alerts only", func(t *testing.T) {
		route, err := url.Parse(d.App.Config.Kube.GuardianWebhookURL)
		if err != nil {
			t.Fatal(err)
		}
		h, p, _ := net.SplitHostPort(route.Host)
		request := "timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%s; printf \"%s %s HTTP/1.0\\r\\nContent-Length: 0\\r\\n\\r\\n\" >&3; head -1 <&3'"
		for _, tc := range []struct{ method, path, status string }{
			{"POST", "/guardianAlert", "401"}, // guardian's own credentials are needed
			{"POST", "/openSession", "404"},
			{"GET", "/getSession", "404"},
			{"GET", "/metrics", "404"},
		} {
			if out := alice.mustRun(fmt.Sprintf(request, h, p, tc.method, tc.path)); !strings.Contains(out, " "+tc.status+" ") {
				t.Errorf("%s %s on the alert route from alice's workspace: %q, want %s", tc.method, tc.path, out, tc.status)
			}
		}
	})
	t.Run("a multi-node lab's machines reach each other on every port and nothing else", func(t *testing.T) {
		a := podShell{d: d, ns: d.Namespace, name: launchers[0].Name, container: "compute"}
		peer := launchers[1].Status.PodIP
		var own []string
		for _, port := range []string{"80", "8080", "49152"} {
			own = append(own, net.JoinHostPort(peer, port))
		}
		own = append(own, "icmp:"+peer)
		got := probeResults(t, a.run(t, "/launcher", append(append([]string{"probe"}, own...), all...)...))
		for _, addr := range own {
			if got[addr] != "open" {
				t.Errorf("carol's machine %s reaches her other machine at %s: %q, want open", launchers[0].Name, addr, got[addr])
			}
		}
		wantClosed(t, "carol's machine "+launchers[0].Name, got)
		// The same port of her machine is closed to a Pod without policy
		// and to alice: the session's own rule opened it.
		for who, out := range map[string]string{
			"the control Pod":   control.run(t, "/tmp/probe", "probe", own[1]),
			"alice's workspace": alice.mustRun("/root/probe probe " + own[1]),
		} {
			if got := probeResults(t, out)[own[1]]; got != "closed" {
				t.Errorf("%s reaches carol's machine at %s: %q, want closed", who, own[1], got)
			}
		}
	})
	t.Run("a Pod of no session in the sessions namespace reaches nothing and nothing reaches it", func(t *testing.T) {
		stray.wait(t)
		dnsAddr := net.JoinHostPort(controlplane.ClusterDNSIP, "53")
		if got := probeResults(t, control.run(t, "/tmp/probe", "probe", "udp:"+dnsAddr))["udp:"+dnsAddr]; got != "open" {
			t.Fatalf("the control Pod's DNS query to the cluster DNS at %s: %q, want an answer", dnsAddr, got)
		}
		self := []string{"127.0.0.1:8080", "udp:" + dnsAddr}
		got := probeResults(t, stray.run(t, "/launcher", append(append([]string{"probe"}, self...), all...)...))
		if got[self[0]] != "open" {
			t.Fatalf("the stray Pod's own port 8080 from inside it: %q, want open", got[self[0]])
		}
		if got[self[1]] != "closed" {
			t.Errorf("the stray Pod's DNS query to the cluster DNS at %s: %q, want no answer", dnsAddr, got[self[1]])
		}
		wantClosed(t, "the stray Pod", got)
		ip := stray.pod(t).Status.PodIP
		at := net.JoinHostPort(ip, "8080")
		if got := probeResults(t, control.run(t, "/tmp/probe", "probe", at))[at]; got != "closed" {
			t.Errorf("the control Pod reaches the stray Pod at %s: %q, want closed", at, got)
		}
		if c, err := net.DialTimeout("tcp", at, 3*time.Second); err == nil {
			c.Close()
			t.Errorf("the host reaches the stray Pod at %s", at)
		}
		// Gone before the end's wait for an empty sessions namespace.
		if err := d.Kube.CoreV1().Pods(d.Namespace).Delete(ctx, "stray", metav1.DeleteOptions{}); err != nil {
			t.Error(err)
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

// probeResults parses the probe command's "ADDR open" and "ADDR closed
// why" lines into the state of each address.
func probeResults(t *testing.T, out string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			got[f[0]] = f[1]
		}
	}
	return got
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

// echoOnNode answers every UDP datagram at addr in the node's network
// namespace with the datagram itself (an address serveOnNode or the node
// already has): enough of a resolver for a probe that counts any answer.
// It returns the address.
func echoOnNode(t *testing.T, addr string) string {
	t.Helper()
	c, err := st.Node.ListenPacket(addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { c.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteTo(buf[:n], from)
		}
	}()
	return c.LocalAddr().String()
}

// podShell is a container a test runs commands in through the API server.
type podShell struct {
	d                   *stacktest.Deployment
	ns, name, container string
}

// controlPod starts a workspace-image Pod in a namespace of its own with
// no NetworkPolicy: what any Pod reaches on the node without confinement.
func controlPod(t *testing.T, d *stacktest.Deployment) podShell {
	t.Helper()
	ns := "netcheck-" + d.Env
	if _, err := d.Kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	p := podIn(t, d, ns, "control", node.WorkspaceImage, "sleep", "infinity")
	p.wait(t)
	return p
}

// podIn creates Pod name in namespace ns with one container running image
// (with command, if given) and returns it without waiting: see wait.
func podIn(t *testing.T, d *stacktest.Deployment, ns, name, image string, command ...string) podShell {
	t.Helper()
	one := int64(1)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &one,
			Containers: []corev1.Container{{Name: labs.WorkspaceContainer, Image: image, Command: command,
				ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	if _, err := d.Kube.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Kube.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return podShell{d: d, ns: ns, name: name, container: labs.WorkspaceContainer}
}

// wait waits until the Pod runs with an address.
func (p podShell) wait(t *testing.T) {
	t.Helper()
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		got, err := p.d.Kube.CoreV1().Pods(p.ns).Get(context.Background(), p.name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning && got.Status.PodIP != "",
			fmt.Sprintf("Pod %s/%s not running with an address (%v)", p.ns, p.name, err)
	})
}

// pod reads the Pod.
func (p podShell) pod(t *testing.T) *corev1.Pod {
	t.Helper()
	got, err := p.d.Kube.CoreV1().Pods(p.ns).Get(context.Background(), p.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// run runs command with args in the container and returns its trimmed
// standard output.
func (p podShell) run(t *testing.T, command string, args ...string) string {
	t.Helper()
	return p.exec(t, nil, append([]string{command}, args...))
}

// upload copies the local file to path in the container, mode 0755.
func (p podShell) upload(t *testing.T, local, path string) {
	t.Helper()
	f, err := os.Open(local)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p.exec(t, f, []string{"sh", "-c", fmt.Sprintf("cat > %s && chmod 0755 %s", path, path)})
}

func (p podShell) exec(t *testing.T, stdin io.Reader, command []string) string {
	t.Helper()
	opts := &corev1.PodExecOptions{Container: p.container, Command: command, Stdin: stdin != nil, Stdout: true, Stderr: true}
	u := p.d.Kube.CoreV1().RESTClient().Post().Namespace(p.ns).Resource("pods").Name(p.name).SubResource("exec").
		VersionedParams(opts, scheme.ParameterCodec).URL()
	ex, err := remotecommand.NewSPDYExecutor(st.CP.Admin, "POST", u)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := ex.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdin: stdin, Stdout: &out, Stderr: &errOut}); err != nil {
		t.Fatalf("%q in %s/%s: %v: %s%s", command, p.name, p.container, err, out.String(), errOut.String())
	}
	return strings.TrimSpace(out.String())
}
