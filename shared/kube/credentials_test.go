package kube

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"labkeep/shared/labs"
	"labkeep/shared/session"
)

func TestVMAccessCredentials(t *testing.T) {
	tests := []struct {
		name     string
		liveKeys bool
		want     func(node string) []kubevirtv1.AccessCredential
	}{
		{"a VM without live keys is as before: cloud-init's keys only", false,
			func(string) []kubevirtv1.AccessCredential { return nil }},
		{"a VM with live keys takes root's keys from its node's Secret through the guest agent", true,
			func(node string) []kubevirtv1.AccessCredential {
				return []kubevirtv1.AccessCredential{{SSHPublicKey: &kubevirtv1.SSHPublicKeyAccessCredential{
					Source: kubevirtv1.SSHPublicKeyAccessCredentialSource{Secret: &kubevirtv1.AccessCredentialSecretSource{
						SecretName: "lk-0b3c6a4e-1f6f-4a50-9d7e-2f3b7d1c9a11-" + node + "-ssh-keys"}},
					PropagationMethod: kubevirtv1.SSHPublicKeyAccessCredentialPropagationMethod{
						QemuGuestAgent: &kubevirtv1.QemuGuestAgentSSHPublicKeyAccessCredentialPropagation{Users: []string{"root"}}},
				}}}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := testBuilder(t, "cluster")
			b.liveKeys = tc.liveKeys
			anchor := b.anchor()
			for _, n := range b.lab.Nodes {
				vm := b.vm(n, anchor)
				if diff := cmp.Diff(tc.want(n.Name), vm.Spec.Template.Spec.AccessCredentials); diff != "" {
					t.Errorf("VM %s accessCredentials (-want +got):\n%s", vm.Name, diff)
				}
			}
		})
	}
}

func TestSSHKeysSecret(t *testing.T) {
	tests := []struct {
		name string
		keys []string
		want string
	}{
		{"a pool VM before its claim: the platform's keys only", []string{"ssh-ed25519 AAAA grader"}, "ssh-ed25519 AAAA grader\n"},
		{"no key at all authorizes nobody", nil, ""},
		{"the student's and the platform's, one per line, blanks skipped",
			[]string{" ssh-ed25519 AAAA student ", "", "ssh-ed25519 AAAA grader"}, "ssh-ed25519 AAAA student\nssh-ed25519 AAAA grader\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := testBuilder(t, "linux")
			anchor := b.anchor()
			anchor.UID = "anchor-uid"
			n := b.lab.Nodes[0]
			got := SSHKeysSecret(b.cfg, b.sess, n, anchor, tc.keys)
			if diff := cmp.Diff(map[string]string{SSHKeysField: tc.want}, got.StringData); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
			if got.Name != session.SSHKeysName(b.sess.ID, n.Name) || got.Namespace != "ns" {
				t.Errorf("Secret %s/%s, want %s/%s", got.Namespace, got.Name, "ns", session.SSHKeysName(b.sess.ID, n.Name))
			}
			if got.Immutable != nil && *got.Immutable {
				t.Error("the keys Secret is immutable: the kubelet would never bring a replacement into the running VM")
			}
			if got.Type != "Opaque" {
				t.Errorf("type %q, want Opaque (the sessions namespace admits no other)", got.Type)
			}
			owner := got.OwnerReferences
			if len(owner) != 1 || owner[0].Kind != "Job" || owner[0].Name != anchor.Name || owner[0].UID != "anchor-uid" {
				t.Errorf("owners %+v, want the anchor alone", owner)
			}
			if diff := cmp.Diff(b.labels(n.Role, n.Name), got.Labels); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLiveKeysOnlyForVMsWithoutAStudentKeyYet(t *testing.T) {
	vm, pod := testBuilder(t, "linux").lab, testBuilder(t, "shell").lab
	tests := []struct {
		name string
		key  string
		lab  labs.Lab
		want bool
	}{
		{"a VM booting before its student (a pool instance): live keys", "", vm, true},
		{"a student's own VM has its key at boot: cloud-init only", "ssh-ed25519 AAAA student", vm, false},
		{"a workspace Pod has no guest agent: never", "", pod, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := liveKeys(session.Session{StudentKey: tc.key}, tc.lab); got != tc.want {
				t.Errorf("liveKeys = %v, want %v", got, tc.want)
			}
		})
	}
}
