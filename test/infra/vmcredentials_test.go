package infra_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"labkeep/infra"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// A warm-pool VM takes root's SSH keys live from its keys Secret
// (KubeVirt accessCredentials through the guest agent), against the real
// API server serving KubeVirt's own CRDs and infra/base/rbac.yaml, with
// labkeep's own code acting as the functions' ServiceAccount:
//   - Provision of a session without a student key yet (an unclaimed pool
//     instance) creates, for every VM lab of
//     infra/base/labs.yaml, VMs whose accessCredentials the server keeps whole
//     (no field dropped, a strict server-side apply of the stored VM
//     passes), and each node's keys Secret holding the platform's keys,
//     owned by the anchor;
//   - KubeVirt's schema really checks that part: a propagation without
//     users, or a misspelt field in it, is refused;
//   - ReplaceSSHKeys swaps each Secret for one holding the student's key
//     too, with the functions' rights (they may not update a Secret);
//     another environment's labkeep refuses to touch it;
//   - the anchor's deletion takes the keys Secrets with it.
//
// No VM boots here (no KubeVirt): that the guest agent writes the keys
// into the running guest is KubeVirt's part, not shown.
func TestPoolVMsTakeSSHKeysLive(t *testing.T) {
	ctx := context.Background()
	suffix := stacktest.Suffix()
	place := infra.Placement{Functions: "keys-fn-" + suffix, Sessions: "keys-vms-" + suffix}
	admin, err := kubernetes.NewForConfig(api.admin)
	if err != nil {
		t.Fatal(err)
	}
	createPlacement(t, admin, place)

	const grader, student = "ssh-ed25519 AAAAgrader grader@platform", "ssh-ed25519 AAAAstudent alice@laptop"
	var warned warnings
	rc := impersonate(place.Functions)
	rc.WarningHandler = &warned
	cfg := kube.DefaultConfig()
	cfg.Namespace, cfg.Env, cfg.MaxLifetime, cfg.PlatformSSHKeys = place.Sessions, "keys-"+suffix, time.Hour, []string{grader}
	cluster, err := kube.NewForConfig(cfg, rc)
	if err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.Env = "other-" + suffix
	foreign, err := kube.NewForConfig(other, rc)
	if err != nil {
		t.Fatal(err)
	}

	var vmLabs []labs.Lab
	for _, l := range labsOf(sampleLabs(t)) {
		if l.Kind == labs.KindVM {
			vmLabs = append(vmLabs, l)
		}
	}
	if len(vmLabs) == 0 {
		t.Fatal("infra/base/labs.yaml has no VM lab")
	}
	for _, lab := range vmLabs {
		t.Run(lab.Name, func(t *testing.T) {
			s := poolSession(lab)
			if err := cluster.Provision(ctx, s, lab); err != nil {
				t.Fatalf("a pool instance of %s refused: %v", lab.Name, err)
			}
			for _, w := range warned.take() {
				if strings.Contains(w, "unknown field") || strings.Contains(w, "duplicate field") {
					t.Errorf("the server dropped part of a %s object: %s", lab.Name, w)
				}
			}
			anchor, err := admin.BatchV1().Jobs(place.Sessions).Get(ctx, session.AnchorName(s.ID), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// keysOf reads node's keys Secret as the admin (the functions
			// cannot) and checks it is the anchor's.
			keysOf := func(t *testing.T, node string) *corev1.Secret {
				t.Helper()
				sec, err := admin.CoreV1().Secrets(place.Sessions).Get(ctx, session.SSHKeysName(s.ID, node), metav1.GetOptions{})
				if err != nil {
					t.Fatalf("keys Secret of %s: %v", node, err)
				}
				if o := sec.OwnerReferences; len(o) != 1 || o[0].UID != anchor.UID {
					t.Errorf("keys Secret of %s owned by %+v, want the anchor %s alone", node, o, anchor.UID)
				}
				return sec
			}
			before := map[string]*corev1.Secret{}
			for _, n := range lab.Nodes {
				vm, err := api.dyn.Resource(virtualMachinesGVR).Namespace(place.Sessions).Get(ctx, session.NodeName(s.ID, n.Name), metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				got, _, _ := unstructured.NestedSlice(vm.Object, "spec", "template", "spec", "accessCredentials")
				want := []any{map[string]any{"sshPublicKey": map[string]any{
					"source":            map[string]any{"secret": map[string]any{"secretName": session.SSHKeysName(s.ID, n.Name)}},
					"propagationMethod": map[string]any{"qemuGuestAgent": map[string]any{"users": []any{"root"}}},
				}}}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("VM %s accessCredentials as stored (-want +got):\n%s", n.Name, diff)
				}
				stored := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
					"metadata": map[string]any{"name": vm.GetName(), "namespace": vm.GetNamespace(), "labels": vm.Object["metadata"].(map[string]any)["labels"]},
					"spec":     vm.Object["spec"],
				}}
				if err := api.apply(ctx, stored, place.Sessions, true); err != nil {
					t.Errorf("strict server-side apply of VM %s: %v", n.Name, err)
				}
				sec := keysOf(t, n.Name)
				if diff := cmp.Diff(map[string][]byte{kube.SSHKeysField: []byte(grader + "\n")}, sec.Data); diff != "" {
					t.Errorf("keys of an unclaimed %s (-want +got):\n%s", n.Name, diff)
				}
				before[n.Name] = sec
			}

			if err := foreign.ReplaceSSHKeys(ctx, s, lab, []string{"ssh-ed25519 AAAAintruder"}); !errors.Is(err, session.ErrNotOurs) {
				t.Errorf("another environment's ReplaceSSHKeys: %v, want %v", err, session.ErrNotOurs)
			}
			for _, n := range lab.Nodes {
				if sec := keysOf(t, n.Name); sec.UID != before[n.Name].UID {
					t.Errorf("another environment replaced the keys Secret of %s", n.Name)
				}
			}

			if err := cluster.ReplaceSSHKeys(ctx, s, lab, []string{student, grader}); err != nil {
				t.Fatalf("ReplaceSSHKeys as the functions: %v", err)
			}
			for _, n := range lab.Nodes {
				sec := keysOf(t, n.Name)
				if diff := cmp.Diff(map[string][]byte{kube.SSHKeysField: []byte(student + "\n" + grader + "\n")}, sec.Data); diff != "" {
					t.Errorf("keys of %s after the claim (-want +got):\n%s", n.Name, diff)
				}
				if sec.UID == before[n.Name].UID {
					t.Errorf("the keys Secret of %s is the one from before", n.Name)
				}
			}

			if err := cluster.Teardown(ctx, s); err != nil {
				t.Fatalf("Teardown: %v", err)
			}
			stacktest.Eventually(t, time.Minute, func() (bool, string) {
				for _, n := range lab.Nodes {
					_, err := admin.CoreV1().Secrets(place.Sessions).Get(ctx, session.SSHKeysName(s.ID, n.Name), metav1.GetOptions{})
					if !apierrors.IsNotFound(err) {
						return false, fmt.Sprintf("keys Secret of %s still there after its anchor went (get: %v)", n.Name, err)
					}
				}
				return true, ""
			})
		})
	}
}

// KubeVirt's schema checks the accessCredentials part itself: each case
// is a VM with a valid entry, changed in one way, created with strict
// field validation.
func TestKubeVirtSchemaChecksAccessCredentials(t *testing.T) {
	ctx := context.Background()
	ns := kubeVirtNamespace(t)
	vm := func(cred map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
			"metadata": map[string]any{"name": "kv-" + stacktest.Suffix()},
			"spec": map[string]any{
				"runStrategy": "Always",
				"template": map[string]any{"spec": map[string]any{
					"domain": map[string]any{
						"devices":   map[string]any{"disks": []any{map[string]any{"name": "root", "disk": map[string]any{"bus": "virtio"}}}},
						"resources": map[string]any{"requests": map[string]any{"memory": "1Gi"}},
					},
					"accessCredentials": []any{map[string]any{"sshPublicKey": cred}},
				}},
			},
		}}
	}
	source := map[string]any{"secret": map[string]any{"secretName": "keys"}}
	for _, tc := range []struct {
		name    string
		cred    map[string]any
		wantErr string // "" means created
	}{
		{"root's keys through the guest agent are created",
			map[string]any{"source": source, "propagationMethod": map[string]any{"qemuGuestAgent": map[string]any{"users": []any{"root"}}}}, ""},
		{"a guest agent propagation without users is refused",
			map[string]any{"source": source, "propagationMethod": map[string]any{"qemuGuestAgent": map[string]any{}}}, "users: Required value"},
		{"a misspelt propagation field is refused",
			map[string]any{"source": source, "propagationMethod": map[string]any{"qemuGuestAgent": map[string]any{"user": []any{"root"}}}},
			`unknown field "spec.template.spec.accessCredentials[0].sshPublicKey.propagationMethod.qemuGuestAgent.user"`},
		{"a key source without a Secret name is refused",
			map[string]any{"source": map[string]any{"secret": map[string]any{}}, "propagationMethod": map[string]any{"qemuGuestAgent": map[string]any{"users": []any{"root"}}}},
			"secretName: Required value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := api.dyn.Resource(virtualMachinesGVR).Namespace(ns).Create(ctx, vm(tc.cred), metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("create refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("create: got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
