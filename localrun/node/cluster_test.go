package node

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/poll"
)

// execIn runs script with bash in the "main" container of Pod name (in
// "default") through the API server and the kubelet, and returns its
// output.
func execIn(ctx context.Context, rc *rest.Config, cs kubernetes.Interface, name, script string) (string, error) {
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "main", Command: []string{"bash", "-c", script}, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(rc, "POST", req.URL())
	if err != nil {
		return "", err
	}
	// Two buffers: the executor copies both streams at once.
	var out, errOut bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
	return strings.TrimSpace(out.String() + errOut.String()), err
}

// assertClusterNetwork checks, from inside Pod client, what a Pod of a
// real cluster relies on: the cluster DNS answers for Services, the
// default/kubernetes Service reaches the API server, and a ClusterIP
// Service in front of Pod server (its sshd) answers by name.
func assertClusterNetwork(t *testing.T, rc *rest.Config, cs kubernetes.Interface, client string, server *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "workspace-ssh", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: server.Labels,
			Ports:    []corev1.ServicePort{{Port: 2222, TargetPort: intstr.FromInt32(22), Protocol: corev1.ProtocolTCP}},
		},
	}
	created, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	domain := controlplane.ClusterDomain
	for _, tc := range []struct {
		name, script, want string
	}{
		{"the API server's Service has its name", "getent hosts kubernetes.default.svc." + domain + " | cut -d' ' -f1", "10.0.0.1"},
		{"the API server answers at its Service", "timeout 5 bash -c 'exec 3<>/dev/tcp/kubernetes.default.svc/443' && echo open", "open"},
		{"a Service has its name", "getent hosts workspace-ssh.default.svc." + domain + " | cut -d' ' -f1", created.Spec.ClusterIP},
		{"a Service answers by name", "timeout 5 bash -c 'exec 3<>/dev/tcp/workspace-ssh/2222; head -c 7 <&3'", "SSH-2.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// kube-proxy and the DNS pick a new Service up within a sync.
			poll.Eventually(t, 30*time.Second, func() (bool, string) {
				got, err := execIn(ctx, rc, cs, client, tc.script)
				return got == tc.want, fmt.Sprintf("%q printed %q (%v), want %q", tc.script, got, err, tc.want)
			})
		})
	}
}

// assertPolicyEnforced checks that the node's NetworkPolicy engine
// filters Pod traffic: a policy that admits nothing into Pod server closes
// its sshd to Pod client (bridged on the node) and to the host (routed
// through the node), and deleting it opens both again. Reachability is
// shown on both sides of the policy, so the closed probe cannot pass for
// a reason of its own.
func assertPolicyEnforced(t *testing.T, rc *rest.Config, cs kubernetes.Interface, client string, server *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	addr := net.JoinHostPort(server.Status.PodIP, "22")
	fromPod := func() bool {
		out, _ := execIn(ctx, rc, cs, client, fmt.Sprintf("timeout 3 bash -c 'exec 3<>/dev/tcp/%s/22' && echo open", server.Status.PodIP))
		return out == "open"
	}
	fromHost := func() bool {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	want := func(open bool, why string) {
		t.Helper()
		poll.Eventually(t, 30*time.Second, func() (bool, string) {
			p, h := fromPod(), fromHost()
			return p == open && h == open, fmt.Sprintf("%s: from the client Pod open=%v, from the host open=%v, want %v", why, p, h, open)
		})
	}
	want(true, "before any policy")
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-into-workspace", Namespace: "default"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: server.Labels},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	if _, err := cs.NetworkingV1().NetworkPolicies("default").Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want(false, "under a policy that admits nothing")
	if err := cs.NetworkingV1().NetworkPolicies("default").Delete(ctx, np.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want(true, "once the policy is deleted")
}
