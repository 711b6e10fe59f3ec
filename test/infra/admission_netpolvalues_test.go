package infra_test

import (
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"labkeep/infra"
	"labkeep/shared/kube"
	"labkeep/shared/session"
)

// The policy's messages for the values of a session's NetworkPolicy, as
// admission-policy.yaml writes them (their start).
const (
	refusedIngressSource = "a NetworkPolicy's ingress from addresses must except every egressBlocked range"
	refusedDNSPeer       = "a NetworkPolicy's DNS may go only to the cluster's DNS Pods"
	refusedWebhookEgress = "a NetworkPolicy's egress to one address (guardian's webhook) must name an address:port of guardianWebhooks"
)

// The webhook address labkeep's sessions of newNetpolFixture post
// guardian's alerts to (so their policies carry a one-address egress
// rule), and the platform's address that may call guardian's API.
const (
	fixtureWebhook        = "10.1.2.3:8080"
	fixturePlatformSource = "192.0.2.10/32"
)

// newNetpolFixture is a policyFixture whose functions post guardian's
// alerts to fixtureWebhook (pinned in guardianWebhooks unless data says
// otherwise) and let fixturePlatformSource call guardian.
func newNetpolFixture(t *testing.T, prefix string, data map[string]string) *policyFixture {
	t.Helper()
	params := map[string]string{"guardianWebhooks": fixtureWebhook} // pinned, as an operator does
	maps.Copy(params, data)
	return newPolicyFixture(t, prefix, params, func(cfg *kube.Config) {
		cfg.GuardianWebhookURL = "http://" + fixtureWebhook + "/guardianAlert"
		cfg.PlatformSourceCIDRs = []string{fixturePlatformSource}
	})
}

// ownNetworkPolicy provisions a session of the sample lab named lab as
// ownSession does and returns it with its NetworkPolicy as stored.
func (f *policyFixture) ownNetworkPolicy(t *testing.T, lab string) (session.Session, networkingv1.NetworkPolicy) {
	t.Helper()
	s, _ := f.ownSession(t, lab)
	var np networkingv1.NetworkPolicy
	typed(t, stored(t, netpolGVR, f.place.Sessions, session.NetworkName(s.ID)), &np)
	return s, np
}

// webhookRule is the one-address egress rule of spec (guardian's webhook),
// the one rule whose ipBlock is not every address.
func webhookRule(t *testing.T, spec *networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicyEgressRule {
	t.Helper()
	for i, r := range spec.Egress {
		if len(r.To) == 1 && r.To[0].IPBlock != nil && r.To[0].IPBlock.CIDR != "0.0.0.0/0" && r.To[0].IPBlock.CIDR != "::/0" {
			return &spec.Egress[i]
		}
	}
	t.Fatal("labkeep's policy has no egress rule to guardian's webhook")
	return nil
}

// The values inside labkeep's rule shapes, under admission-policy.yaml on
// the real API server (rbac.yaml, the functions impersonated): a copy of
// labkeep's own NetworkPolicy of a Pod lab, changed in one value, is
// refused with the policy's sentence for it.
//   - guardian's webhook rule (one TCP port of one address) is never at a
//     link-local address, the cloud metadata service's range, whatever
//     guardianWebhooks says; pinned to labkeep's address:port there, it
//     may name no other address (the API server's) nor another port of
//     that one, and every sample lab's objects are still created for real.
//     With *, any other address is admitted; the file's own value, "",
//     admits none (an operator pins theirs).
//   - DNS goes to clusterDNS's Pods alone, by exactly its selector: not to
//     another namespace, not to other Pods of the DNS namespace.
//   - a source range holding a blocked range excepts it, as labkeep's SSH
//     rule does: 0.0.0.0/0 without the exceptions, ::/0 without fc00::/7
//     are refused; a public range holding none passes.
//
// (The internet rule's own exceptions and its ports are the shape rule's:
// TestAdmissionAllowsOnlyTheSessionsNetworkPolicy.)
func TestAdmissionRefusesWidenedNetworkPolicyValues(t *testing.T) {
	tcp := corev1.ProtocolTCP
	port := func(n int32) *intstr.IntOrString { p := intstr.FromInt32(n); return &p }
	// webhookAt points a copy's webhook rule at cidr and port n.
	webhookAt := func(cidr string, n int32) func(s *networkingv1.NetworkPolicySpec) {
		return func(s *networkingv1.NetworkPolicySpec) {
			r := webhookRule(t, s)
			r.To[0].IPBlock.CIDR = cidr
			r.Ports = []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(n)}}
		}
	}
	const metadata, apiServer = "169.254.169.254/32", "10.96.0.1/32"

	t.Run("guardianWebhooks pinned", func(t *testing.T) {
		f := newNetpolFixture(t, "npv", nil)
		t.Run("labkeep's own objects are admitted", func(t *testing.T) {
			for _, lab := range labsOf(sampleLabs(t)) {
				t.Run(lab.Name, func(t *testing.T) { provisionOwn(t, f.cluster, studentSession(lab), lab) })
			}
		})
		_, np := f.ownNetworkPolicy(t, "shell")
		copyOf := func(edit func(s *networkingv1.NetworkPolicySpec)) crafted { return netpolCopy(&np, edit) }
		dnsTo := func(ns string, labels map[string]string) func(s *networkingv1.NetworkPolicySpec) {
			return func(s *networkingv1.NetworkPolicySpec) {
				s.Egress[0].To = []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: labels},
				}}
			}
		}
		// sourcesFrom lets guardian's API in from cidr, excepting except.
		sourcesFrom := func(cidr string, except ...string) func(s *networkingv1.NetworkPolicySpec) {
			return func(s *networkingv1.NetworkPolicySpec) {
				s.Ingress = append(s.Ingress, networkingv1.NetworkPolicyIngressRule{
					From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(9090)}},
				})
			}
		}
		testAdmission(t, f.fnDyn, f.place.Sessions, []admissionCase{
			{"labkeep's own policy, its webhook pinned", copyOf(nil), nameTaken},
			{"the webhook rule at the metadata service", copyOf(webhookAt(metadata, 80)), refusedWebhookEgress},
			{"the webhook rule at an IPv6 link-local address", copyOf(webhookAt("fe80::1/128", 8080)), refusedWebhookEgress},
			{"the webhook rule at the API server", copyOf(webhookAt(apiServer, 443)), refusedWebhookEgress},
			{"the webhook rule at the pinned address on another port", copyOf(webhookAt("10.1.2.3/32", 22)), refusedWebhookEgress},
			{"DNS to another namespace's Pods", copyOf(dnsTo("default", map[string]string{"k8s-app": "kube-dns"})), refusedDNSPeer},
			{"DNS to other Pods of the DNS namespace", copyOf(dnsTo("kube-system", map[string]string{"component": "etcd"})), refusedDNSPeer},
			{"DNS to a selector other than clusterDNS's (one label more)", copyOf(dnsTo("kube-system", map[string]string{"k8s-app": "kube-dns", "tier": "node"})), refusedDNSPeer},
			{"SSH from every IPv4 address without the blocked ranges excepted", copyOf(func(s *networkingv1.NetworkPolicySpec) {
				for i := range s.Ingress[0].From {
					if s.Ingress[0].From[i].IPBlock.CIDR == "0.0.0.0/0" {
						s.Ingress[0].From[i].IPBlock.Except = nil
					}
				}
			}), refusedIngressSource},
			{"guardian's API from every IPv6 address but link-local", copyOf(sourcesFrom("::/0", "fe80::/10")), refusedIngressSource},
			{"guardian's API from a public range holding no blocked range", copyOf(sourcesFrom("203.0.113.0/24")), nameTaken},
		})
	})

	// The file admits no webhook rule at all (knative-service.yaml names
	// no webhook address); an operator pins theirs or, knowingly, writes *.
	if got := admissionParams(t, infra.Placement{}).Data["guardianWebhooks"]; strings.TrimSpace(got) != "" {
		t.Errorf("admission-policy.yaml's guardianWebhooks is %q, want \"\": no deployment it ships names a webhook address", got)
	}
	t.Run("guardianWebhooks *", func(t *testing.T) {
		f := newNetpolFixture(t, "npw", map[string]string{"guardianWebhooks": "*"})
		_, np := f.ownNetworkPolicy(t, "shell")
		testAdmission(t, f.fnDyn, f.place.Sessions, []admissionCase{
			{"labkeep's own policy", netpolCopy(&np, nil), nameTaken},
			{"the webhook rule at the metadata service", netpolCopy(&np, webhookAt(metadata, 80)), refusedWebhookEgress},
			{"the webhook rule at any other address", netpolCopy(&np, webhookAt(apiServer, 443)), nameTaken},
		})
	})
}
