package kubevirt_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"labkeep/localrun/images"
	"labkeep/localrun/stacktest"
)

var (
	vmResource  = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	vmiResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
)

// keyPair is an ed25519 key in the forms cloud-init and an SSH client
// take.
type keyPair struct {
	signer     ssh.Signer
	public     string // authorized_keys line
	privatePEM string // OpenSSH private key
}

func newKey(t *testing.T) keyPair {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return keyPair{signer: signer, public: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))), privatePEM: string(pem.EncodeToMemory(block))}
}

// cloudConfig is a NoCloud user-data that authorizes key for root and
// gives the guest host as its SSH host key, as labkeep's sessions do.
func cloudConfig(key, host keyPair) string {
	indent := func(s string) string {
		return "    " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n    ")
	}
	return fmt.Sprintf(`#cloud-config
disable_root: false
ssh_pwauth: false
users: [root]
ssh_authorized_keys:
  - %s
ssh_deletekeys: true
ssh_keys:
  ed25519_private: |
%s
  ed25519_public: %s
`, key.public, indent(host.privatePEM), host.public)
}

// guestVM is a one-vCPU, 1 GiB VM of the local guest disk with cloud-init
// from the Secret userData, Ready when its SSH port answers.
func guestVM(name, userData string) *kubevirtv1.VirtualMachine {
	always := kubevirtv1.RunStrategyAlways
	mem := resource.MustParse("1Gi")
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: mem}
	grace := int64(30)
	return &kubevirtv1.VirtualMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: &always,
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"vm": name}},
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					TerminationGracePeriodSeconds: &grace,
					Domain: kubevirtv1.DomainSpec{
						Resources: kubevirtv1.ResourceRequirements{Requests: res, Limits: res},
						Memory:    &kubevirtv1.Memory{Guest: &mem},
						Devices: kubevirtv1.Devices{
							Disks: []kubevirtv1.Disk{
								{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
								{Name: "cloudinit", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
							},
							Interfaces: []kubevirtv1.Interface{{
								Name:                   "default",
								InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
							}},
						},
					},
					Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
					Volumes: []kubevirtv1.Volume{
						{Name: "root", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{
							Image: images.GuestDebian, ImagePullPolicy: corev1.PullNever,
						}}},
						{Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{
							UserDataSecretRef: &corev1.LocalObjectReference{Name: userData},
						}}},
					},
					ReadinessProbe: &kubevirtv1.Probe{
						Handler:             kubevirtv1.Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(22)}},
						InitialDelaySeconds: 10,
						PeriodSeconds:       2,
					},
				},
			},
		},
	}
}

// TestGuestBootsAndAcceptsOnlyItsKey boots a real guest under KubeVirt
// (software emulation) and logs in as root with the key cloud-init gave
// it, checking the host key cloud-init installed; another key is refused.
func TestGuestBootsAndAcceptsOnlyItsKey(t *testing.T) {
	cp, _ := startNode(t)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	key, other, host := newKey(t), newKey(t), newKey(t)
	if _, err := cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "guest-cloudinit", Namespace: "default"},
		StringData: map[string]string{"userdata": cloudConfig(key, host)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vm := guestVM("guest", "guest-cloudinit")
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vm)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := dyn.Resource(vmResource).Namespace("default").Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var vmi kubevirtv1.VirtualMachineInstance
	deadline := time.Now().Add(8 * time.Minute)
	for {
		u, err := dyn.Resource(vmiResource).Namespace("default").Get(ctx, "guest", metav1.GetOptions{})
		if err == nil {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &vmi); err != nil {
				t.Fatal(err)
			}
			if ready(&vmi) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("VMI not Ready after %s: phase %q, conditions %+v", time.Since(start).Round(time.Second), vmi.Status.Phase, vmi.Status.Conditions)
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("VM created → VMI Ready (SSH answers) in %s", time.Since(start).Round(100*time.Millisecond))
	if len(vmi.Status.Interfaces) == 0 || vmi.Status.Interfaces[0].IP == "" {
		t.Fatalf("VMI has no IP: %+v", vmi.Status.Interfaces)
	}
	addr := net.JoinHostPort(vmi.Status.Interfaces[0].IP, "22")
	var out string
	for {
		out, err = stacktest.SSHRun(addr, "root", key.signer, ssh.FixedHostKey(host.signer.PublicKey()), "id -u")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	if err != nil || out != "0" {
		t.Fatalf("ssh root@%s id -u = %q, %v; want 0", addr, out, err)
	}
	t.Logf("VM created → first root login in %s", time.Since(start).Round(100*time.Millisecond))
	if out, err := stacktest.SSHRun(addr, "root", other.signer, ssh.FixedHostKey(host.signer.PublicKey()), "id -u"); err == nil {
		t.Errorf("another key logged in (id -u = %q)", out)
	}
}

func ready(vmi *kubevirtv1.VirtualMachineInstance) bool {
	for _, c := range vmi.Status.Conditions {
		if c.Type == kubevirtv1.VirtualMachineInstanceReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
