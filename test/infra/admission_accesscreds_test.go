package infra_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"

	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// The policy's messages for accessCredentials and keys Secrets, as
// admission-policy.yaml writes them (the start of each).
const (
	refusedAccessCredentials = "a VirtualMachine's accessCredentials may only give root its SSH keys through the qemuGuestAgent from its own node's keys Secret"
	refusedKeysSecret        = "a keys Secret (a name ending in -ssh-keys) must be"
)

// What the functions' ServiceAccount may put in a VM's accessCredentials,
// under admission-policy.yaml on the real API server (KubeVirt's own
// CRDs, rbac.yaml, the functions impersonated). The guest agent writes
// whatever the named Secret holds into the guest, so only labkeep's own
// entry passes: root's SSH keys, through the qemuGuestAgent, from the
// node's own keys Secret, in the node's own VM.
//   - labkeep's own pool instance (a session without a student key yet:
//     VMs with accessCredentials, keys Secrets owned by the anchor) is
//     created for real by Provision, and a copy of its VM passes again;
//   - the same VM changed in one way is refused with the policy's
//     sentence: another session's keys Secret, the node's cloud-init
//     Secret, the database Secret, a userPassword, a user besides or
//     instead of root, a configDrive or noCloud propagation, a second
//     entry, a VM not named for its node or without a node label;
//   - a Secret named like a keys Secret must be the node's keys Secret of
//     its labelled session, owned by that session's anchor alone; labkeep's
//     own (Provision's, and ReplaceSSHKeys' at a claim) are created.
//
// Each crafted object is created with dryRun=All (admission runs, nothing
// is stored).
func TestAdmissionLimitsAccessCredentials(t *testing.T) {
	ctx := context.Background()
	place, env, admin, fnRC := underAdmissionPolicy(t, "creds")
	fnDyn := dynamic.NewForConfigOrDie(fnRC)
	const grader = "ssh-ed25519 AAAAgrader grader@platform"
	cfg := kube.DefaultConfig()
	cfg.Namespace, cfg.Env, cfg.MaxLifetime, cfg.PlatformSSHKeys = place.Sessions, env, time.Hour, []string{grader}
	cluster, err := kube.NewForConfig(cfg, fnRC)
	if err != nil {
		t.Fatal(err)
	}

	// The policy is active a moment after it is created: wait until it
	// refuses a keys Secret owned by nobody.
	probe := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "lk-probe-vm-ssh-keys", Labels: map[string]string{
		kube.LabelEnv: env, kube.LabelSession: "probe", kube.LabelNode: "vm", kube.LabelRole: "vm", "app.kubernetes.io/managed-by": "labkeep",
	}}, Type: corev1.SecretTypeOpaque}
	awaitPolicy(t, fnDyn, secretsGVR, place.Sessions, probe, refusedKeysSecret)
	logTypeWarnings(t, admin)

	lab, ok := sampleLabs(t).Get("linux-vm")
	if !ok {
		t.Fatal("infra/base/labs.yaml has no linux-vm lab")
	}
	node := lab.Nodes[0]
	// Pool instances: no student key, so their VMs take their keys live.
	own := provisionOwn(t, cluster, poolSession(lab), lab)
	other := provisionOwn(t, cluster, poolSession(lab), lab)
	vm := stored(t, vmGVR, place.Sessions, session.NodeName(own.ID, node.Name))
	got, _, _ := unstructured.NestedSlice(vm.Object, "spec", "template", "spec", "accessCredentials")
	wantCreds := []any{map[string]any{"sshPublicKey": map[string]any{
		"source":            map[string]any{"secret": map[string]any{"secretName": session.SSHKeysName(own.ID, node.Name)}},
		"propagationMethod": map[string]any{"qemuGuestAgent": map[string]any{"users": []any{"root"}}},
	}}}
	if diff := cmp.Diff(wantCreds, got); diff != "" {
		t.Fatalf("labkeep's own VM's accessCredentials as stored (-want +got):\n%s", diff)
	}
	anchor, err := admin.BatchV1().Jobs(place.Sessions).Get(ctx, session.AnchorName(own.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The copies keep the real VM's name (the policy ties it to the keys
	// Secret), so the real one goes.
	removeOwn(t, vmGVR, place.Sessions, vm.GetName())
	virtualMachine := vmCopies(vm, vm.GetName())
	// withCreds is labkeep's own VM with accessCredentials creds.
	withCreds := func(creds ...any) crafted {
		return virtualMachine(func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedSlice(u.Object, creds, "spec", "template", "spec", "accessCredentials")
		})
	}
	// ownCred is labkeep's own accessCredentials entry changed by edit.
	ownCred := func(edit func(cred map[string]any)) map[string]any {
		cred := runtime.DeepCopyJSONValue(wantCreds[0]).(map[string]any)
		edit(cred)
		return cred
	}
	sshKey := func(secret string, propagation map[string]any) map[string]any {
		return map[string]any{"sshPublicKey": map[string]any{
			"source":            map[string]any{"secret": map[string]any{"secretName": secret}},
			"propagationMethod": propagation,
		}}
	}
	ownKeys := session.SSHKeysName(own.ID, node.Name)
	rootByAgent := func() map[string]any {
		return map[string]any{"qemuGuestAgent": map[string]any{"users": []any{"root"}}}
	}
	userPassword := map[string]any{"userPassword": map[string]any{
		"source":            map[string]any{"secret": map[string]any{"secretName": ownKeys}},
		"propagationMethod": map[string]any{"qemuGuestAgent": map[string]any{}},
	}}
	// keysSecret is labkeep's own keys Secret of node name of the session
	// owning anchor, changed by edit.
	keysSecret := func(name string, edit func(s *corev1.Secret)) crafted {
		s := kube.SSHKeysSecret(cfg, own, labs.Node{Name: name, Role: node.Role}, anchor, []string{grader})
		if edit != nil {
			edit(s)
		}
		return crafted{secretsGVR, s}
	}

	tests := []admissionCase{
		{"labkeep's own VM with live keys", virtualMachine(nil), ""},
		{"another session's keys Secret", withCreds(sshKey(session.SSHKeysName(other.ID, node.Name), rootByAgent())), refusedAccessCredentials},
		{"the node's cloud-init Secret (host private key, grading token)", withCreds(sshKey(session.CloudInitName(own.ID, node.Name), rootByAgent())), refusedAccessCredentials},
		{"the database Secret", withCreds(sshKey("labkeep-secrets", rootByAgent())), refusedAccessCredentials},
		{"a userPassword from the node's keys Secret", withCreds(userPassword), refusedAccessCredentials},
		{"a userPassword besides labkeep's entry", withCreds(ownCred(func(map[string]any) {}), userPassword), refusedAccessCredentials},
		{"labkeep's entry twice", withCreds(ownCred(func(map[string]any) {}), ownCred(func(map[string]any) {})), refusedAccessCredentials},
		{"a user other than root", withCreds(ownCred(func(cred map[string]any) {
			_ = unstructured.SetNestedStringSlice(cred, []string{"alice"}, "sshPublicKey", "propagationMethod", "qemuGuestAgent", "users")
		})), refusedAccessCredentials},
		{"a user besides root", withCreds(ownCred(func(cred map[string]any) {
			_ = unstructured.SetNestedStringSlice(cred, []string{"root", "alice"}, "sshPublicKey", "propagationMethod", "qemuGuestAgent", "users")
		})), refusedAccessCredentials},
		{"a noCloud propagation", withCreds(sshKey(ownKeys, map[string]any{"noCloud": map[string]any{}})), refusedAccessCredentials},
		{"a configDrive propagation besides the guest agent", withCreds(ownCred(func(cred map[string]any) {
			_ = unstructured.SetNestedMap(cred, map[string]any{}, "sshPublicKey", "propagationMethod", "configDrive")
		})), refusedAccessCredentials},
		{"a VM not named for its node", virtualMachine(func(u *unstructured.Unstructured) {
			u.SetName("crafted")
		}), refusedAccessCredentials},
		{"a VM without a node label naming the keys Secret it would imply", virtualMachine(func(u *unstructured.Unstructured) {
			l := u.GetLabels()
			delete(l, kube.LabelNode)
			u.SetLabels(l)
			_ = unstructured.SetNestedSlice(u.Object, []any{sshKey("lk-"+own.ID+"--ssh-keys", rootByAgent())}, "spec", "template", "spec", "accessCredentials")
		}), refusedAccessCredentials},
		{"labkeep's own keys Secret of a node", keysSecret("extra", nil), ""},
		{"a keys Secret named for another session", keysSecret("extra", func(s *corev1.Secret) {
			s.Name = session.SSHKeysName(other.ID, "extra")
		}), refusedKeysSecret},
		{"a keys Secret named for another node", keysSecret("extra", func(s *corev1.Secret) {
			s.Name = session.SSHKeysName(own.ID, "elsewhere")
		}), refusedKeysSecret},
		{"a keys Secret owned by nobody", keysSecret("extra", func(s *corev1.Secret) {
			s.OwnerReferences = nil
		}), refusedKeysSecret},
		{"a keys Secret owned by another session's anchor", keysSecret("extra", func(s *corev1.Secret) {
			s.OwnerReferences[0].Name = session.AnchorName(other.ID)
		}), refusedKeysSecret},
		{"a keys Secret owned by the anchor and another object", keysSecret("extra", func(s *corev1.Secret) {
			s.OwnerReferences = append(s.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: anchor.UID})
		}), refusedKeysSecret},
	}
	// A claim replaces the keys Secrets (ReplaceSSHKeys) under the policy.
	t.Run("labkeep's claim replaces the keys Secrets", func(t *testing.T) {
		const student = "ssh-ed25519 AAAAstudent alice@laptop"
		if err := cluster.ReplaceSSHKeys(ctx, other, lab, []string{student, grader}); err != nil {
			t.Fatalf("ReplaceSSHKeys as the functions: %v", err)
		}
		sec, err := admin.CoreV1().Secrets(place.Sessions).Get(ctx, session.SSHKeysName(other.ID, node.Name), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(map[string][]byte{kube.SSHKeysField: []byte(student + "\n" + grader + "\n")}, sec.Data); diff != "" {
			t.Errorf("keys after the claim (-want +got):\n%s", diff)
		}
	})
	testAdmission(t, fnDyn, place.Sessions, tests)
}
