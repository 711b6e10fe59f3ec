package node

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/localrun/childproc"
	"labkeep/localrun/controlplane"
	"labkeep/localrun/netpolicy"
)

// policyAccount is the identity the NetworkPolicy engine runs as.
const policyAccount = "kube-router"

// policyChain is a chain the engine creates in the node's filter table on
// its first sync; from then on every Pod of the node is filtered.
const policyChain = "KUBE-ROUTER-FORWARD"

// grant gives the ServiceAccount kube-system/account the cluster-wide
// rules (ClusterRole and binding labkeep:<account>), as a cluster's
// add-on would be given them.
func grant(ctx context.Context, cs kubernetes.Interface, account string, rules []rbacv1.PolicyRule) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "labkeep:" + account}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "kube-system", Name: account}}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// startPolicyEngine starts the NetworkPolicy engine (package netpolicy) in
// the node's network namespace as kube-system/kube-router, and returns once
// it has programmed the node's filter table.
func (n *Node) startPolicyEngine(ctx context.Context, cp *controlplane.ControlPlane, cs kubernetes.Interface, bin string) error {
	if err := grant(ctx, cs, policyAccount, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces", "nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "watch"}},
	}); err != nil {
		return err
	}
	rc, err := cp.ServiceAccountConfig(ctx, "kube-system", policyAccount)
	if err != nil {
		return err
	}
	kubeconfig := n.path("kube-router.kubeconfig")
	if err := controlplane.WriteKubeconfig(kubeconfig, rc, policyAccount); err != nil {
		return err
	}
	args := append([]string{"nsenter", "--net=" + netnsPath(n.netPid), "--", bin}, netpolicy.Args(kubeconfig, n.Name, controlplane.ServiceCIDR)...)
	p, err := childproc.Start("kube-router", n.path("kube-router.log"), childproc.Attr{Env: []string{"PATH=" + sbinPath, "HOME=" + n.Dir}}, args...)
	if err != nil {
		return err
	}
	n.procs = append(n.procs, p)
	for {
		if done, err := p.Exited(); done {
			return fmt.Errorf("kube-router %w (%v); log:\n%s", childproc.ErrExited, err, p.LogTail(3000))
		}
		if exec.Command("nsenter", "--net="+netnsPath(n.netPid), "--", "iptables", "-w", "-S", policyChain).Run() == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-router programmed no rules: %w; log:\n%s", ctx.Err(), p.LogTail(3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Confines reports whether the policy engine has put the Pod address ip
// under a firewall chain in the node's filter table: from then on a
// connection to that Pod passes its NetworkPolicies (or, selected by none,
// is let through by the chain). A Pod whose address is not there yet is
// reachable as if no policy existed.
func (n *Node) Confines(ip string) (bool, error) {
	out, err := exec.Command("nsenter", "--net="+netnsPath(n.netPid), "--", "iptables", "-w", "-S", policyChain).CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("iptables -S %s: %w: %s", policyChain, err, out)
	}
	return strings.Contains(string(out), " -d "+ip+"/32 "), nil
}
