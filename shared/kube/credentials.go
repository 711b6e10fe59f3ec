package kube

import (
	"context"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// Live SSH keys for running VMs. Cloud-init hands a VM its authorized keys
// once, at first boot; a warm-pool VM boots before its student exists, so
// the student's key must reach the running guest later, without a reboot.
// KubeVirt does that with accessCredentials: with the qemuGuestAgent
// propagation method, the VM's virt-launcher Pod mounts the named Secret,
// watches it, and has the guest agent overwrite the listed users'
// authorized_keys with exactly the keys the Secret holds: at boot, within
// seconds of every change the kubelet brings into the Pod (a Secret
// volume follows its Secret at the kubelet's next sync, typically within a
// minute or two), and every five minutes regardless.
//
// So a VM built with live keys has root's authorized keys from its node's
// keys Secret (session.SSHKeysName) and from nothing else: any key written
// by hand into root's authorized_keys is gone at the next sync, and the
// Secret must hold the platform's keys as well as the student's. The guest
// image must run qemu-guest-agent (the agent channel is KubeVirt's
// default); without it the keys cloud-init wrote at boot stay and the VMI
// reports AccessCredentialsSynchronized false.

// SSHKeysField is the one data entry of a keys Secret: authorized_keys
// lines. KubeVirt reads every entry of the Secret as a file of keys, one
// per line, blank lines ignored.
const SSHKeysField = "authorized_keys"

// liveKeys reports whether s's VMs take root's keys live: those of a
// session provisioned without a student key, which must come later, while
// the VM runs (an unclaimed warm-pool instance boots before its student
// exists; a claim calls ReplaceSSHKeys). A session with its student's key
// at boot keeps cloud-init's keys alone, so its guest is never asked for an
// agent.
func liveKeys(s session.Session, lab labs.Lab) bool {
	return lab.Kind == labs.KindVM && s.StudentKey == ""
}

// accessCredentials is a VM's one accessCredentials entry: root's keys
// from the node's keys Secret, through the guest agent.
func accessCredentials(sessionID, node string) []kubevirtv1.AccessCredential {
	return []kubevirtv1.AccessCredential{{SSHPublicKey: &kubevirtv1.SSHPublicKeyAccessCredential{
		Source: kubevirtv1.SSHPublicKeyAccessCredentialSource{
			Secret: &kubevirtv1.AccessCredentialSecretSource{SecretName: session.SSHKeysName(sessionID, node)},
		},
		PropagationMethod: kubevirtv1.SSHPublicKeyAccessCredentialPropagationMethod{
			QemuGuestAgent: &kubevirtv1.QemuGuestAgentSSHPublicKeyAccessCredentialPropagation{Users: []string{labs.SSHUser}},
		},
	}}}
}

// sshKeys is node n's keys Secret holding keys (empty ones skipped; none
// at all is a valid Secret that authorizes nobody). Owned by the anchor
// like the cloud-init Secret, so the garbage collector reclaims it with
// the session. It is not immutable: the kubelet stops following an
// immutable Secret, and a replacement (ReplaceSSHKeys) must reach the
// running VM.
func (b builder) sshKeys(n labs.Node, anchor *batchv1.Job, keys []string) *corev1.Secret {
	var lines strings.Builder
	for _, k := range keys {
		if k = strings.TrimSpace(k); k != "" {
			lines.WriteString(k + "\n")
		}
	}
	return &corev1.Secret{
		ObjectMeta: b.owned(session.SSHKeysName(b.sess.ID, n.Name), n.Role, n.Name, anchor),
		Type:       corev1.SecretTypeOpaque,
		StringData: map[string]string{SSHKeysField: lines.String()},
	}
}

// SSHKeysSecret is the keys Secret of node n of session s, owned by the
// session's anchor (as created, with its UID), authorizing keys. Provision
// creates one per VM node of a session with live keys, before the VMs: a
// virt-launcher Pod does not start without it.
func SSHKeysSecret(cfg Config, s session.Session, n labs.Node, anchor *batchv1.Job, keys []string) *corev1.Secret {
	return builder{cfg: cfg, sess: s}.sshKeys(n, anchor, keys)
}

// ReplaceSSHKeys makes keys the authorized keys of every node of s, a VM
// session provisioned with live keys, while its VMs run: each node's keys
// Secret is replaced by one holding keys. The functions may neither read
// nor update Secrets (infra/base/rbac.yaml), so a replacement is a delete by
// name and a create, the new Secret again owned by the session's anchor,
// which is read and checked (this environment's, this session's) first;
// the name carries the session's id, so no other session's Secret is ever
// touched. Between the delete and the create the kubelet keeps the files
// it last wrote, so the guest never sees an empty key set.
//
// It returns once the new Secrets exist; the guest has the keys only when
// the kubelet and the guest agent have carried them in (see the comment
// at the top of this file), which no API object confirms. On error some
// nodes may hold keys already: the caller must not hand the session to
// anyone else.
func (c *Cluster) ReplaceSSHKeys(ctx context.Context, s session.Session, lab labs.Lab, keys []string) error {
	if lab.Kind != labs.KindVM {
		return fmt.Errorf("replacing the SSH keys of session %s: lab %s has no VMs", s.ID, lab.Name)
	}
	api, err := c.api(session.KindAnchor)
	if err != nil {
		return err
	}
	ref := session.ObjectRef{Kind: session.KindAnchor, Name: session.AnchorName(s.ID)}
	m, err := c.read(ctx, api, ref.Name)
	if err != nil {
		return fmt.Errorf("replacing the SSH keys of session %s: reading %s: %w", s.ID, ref, err)
	}
	if m == nil {
		return fmt.Errorf("replacing the SSH keys of session %s: %s is gone", s.ID, ref)
	}
	if err := c.owns(ref, m, s.ID); err != nil {
		return err
	}
	anchor := &batchv1.Job{}
	anchor.Name, anchor.UID = m.GetName(), m.GetUID()
	b := builder{cfg: c.cfg, sess: s, lab: lab}
	secrets := c.kube.CoreV1().Secrets(c.cfg.Namespace)
	for _, n := range lab.Nodes {
		name := session.SSHKeysName(s.ID, n.Name)
		dctx, cancel := c.call(ctx)
		err := secrets.Delete(dctx, name, metav1.DeleteOptions{})
		cancel()
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("replacing the SSH keys of %s: deleting Secret %s: %w", n.Name, name, err)
		}
		if _, err := create(ctx, c, "SSH keys Secret "+n.Name, b.sshKeys(n, anchor, keys), secrets.Create); err != nil {
			return fmt.Errorf("replacing the SSH keys of %s: %w", n.Name, err)
		}
	}
	return nil
}
