package node

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"labkeep/localrun/controlplane"
	"labkeep/localrun/images"
)

// The cluster DNS: CoreDNS as a production cluster runs it (a Deployment
// in kube-system behind the kube-dns Service at controlplane.ClusterDNSIP,
// reading Services and Pods through the default/kubernetes Service), and
// the kubelet's clusterDNS, so a Pod resolves <service>.<namespace>.svc.
// Names outside the cluster's zones get no answer: nothing beyond the
// machine can be reached.
const (
	dnsNamespace = metav1.NamespaceSystem
	dnsName      = "coredns"
	dnsService   = "kube-dns"
)

// corefile serves the cluster's zones from the API (Pod records for
// addresses, as kube-dns did) with its health (:8080) and readiness
// (:8181) endpoints.
var corefile = fmt.Sprintf(`.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    kubernetes %s in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    reload
}
`, controlplane.ClusterDomain)

// startDNS creates the cluster DNS's objects and waits until its Pod is
// ready (it answers from a synced view of the cluster).
func (n *Node) startDNS(ctx context.Context, cs kubernetes.Interface) error {
	labels := map[string]string{"k8s-app": dnsService}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: dnsName, Namespace: dnsNamespace}}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "system:" + dnsName}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "system:" + dnsName},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: dnsNamespace, Name: dnsName}}}
	config := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: dnsName, Namespace: dnsNamespace}, Data: map[string]string{"Corefile": corefile}}
	replicas := int32(1)
	probe := func(path string, port int32) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port)}},
			PeriodSeconds: 1, FailureThreshold: 60}
	}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: dnsName, Namespace: dnsNamespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: dnsName,
					DNSPolicy:          corev1.DNSDefault,
					PriorityClassName:  "system-cluster-critical",
					Containers: []corev1.Container{{
						Name:            dnsName,
						Image:           images.CoreDNS,
						ImagePullPolicy: corev1.PullNever,
						Args:            []string{"-conf", "/etc/coredns/Corefile"},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
						},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("70Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("170Mi")},
						},
						ReadinessProbe: probe("/ready", 8181),
						LivenessProbe:  probe("/health", 8080),
						VolumeMounts:   []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
						ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: dnsName}}}}},
				},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: dnsService, Namespace: dnsNamespace, Labels: labels},
		Spec: corev1.ServiceSpec{
			ClusterIP: controlplane.ClusterDNSIP,
			Selector:  labels,
			Ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromString("dns")},
				{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("dns-tcp")},
			},
		},
	}
	for _, create := range []func() error{
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(dnsNamespace).Create(ctx, sa, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().ConfigMaps(dnsNamespace).Create(ctx, config, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().Services(dnsNamespace).Create(ctx, svc, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.AppsV1().Deployments(dnsNamespace).Create(ctx, deploy, metav1.CreateOptions{})
			return err
		},
	} {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("cluster DNS: %w", err)
		}
	}
	for {
		d, err := cs.AppsV1().Deployments(dnsNamespace).Get(ctx, dnsName, metav1.GetOptions{})
		if err == nil && d.Status.ReadyReplicas > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster DNS not ready: %w (%v); kubelet log:\n%s", ctx.Err(), err, n.LogTail("kubelet", 3000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
