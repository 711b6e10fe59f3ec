package node

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/localrun/childproc"
	"labkeep/localrun/controlplane"
)

// proxyConfig is kube-proxy's KubeProxyConfiguration: iptables mode, as a
// production node runs it, in the node's network namespace (its rules and
// conntrack entries are the node's alone). It leaves the kernel's
// conntrack table size and timeouts alone (they are the host's, and not
// writable from a network namespace of its own) and opens no node ports
// on loopback.
func (n *Node) proxyConfig(kubeconfig string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
mode: iptables
clusterCIDR: %q
hostnameOverride: %q
bindAddress: %q
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
`, kubeconfig, n.net.cidr, n.Name, n.net.nodeIP)
}

// proxyAccount is the ServiceAccount kube-proxy runs as, bound to the
// node-proxier role every cluster has.
const proxyAccount = "kube-proxy"

// startProxy starts kube-proxy in the node's network namespace as
// kube-system/kube-proxy.
func (n *Node) startProxy(ctx context.Context, cp *controlplane.ControlPlane, bin string) error {
	rc, err := cp.ServiceAccountConfig(ctx, "kube-system", proxyAccount)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "labkeep:kube-proxy"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "kube-system", Name: proxyAccount}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	kubeconfig := n.path("kube-proxy.kubeconfig")
	if err := controlplane.WriteKubeconfig(kubeconfig, rc, proxyAccount); err != nil {
		return err
	}
	if err := n.writeFiles(map[string]string{"kube-proxy.yaml": n.proxyConfig(kubeconfig)}); err != nil {
		return err
	}
	p, err := childproc.Start("kube-proxy", n.path("kube-proxy.log"), childproc.Attr{Env: []string{"PATH=" + sbinPath, "HOME=" + n.Dir}},
		"nsenter", "--net="+netnsPath(n.netPid), "--", bin, "--config="+n.path("kube-proxy.yaml"), "--v=0")
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	return nil
}
