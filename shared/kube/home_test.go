package kube

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// A home's name is the student's, per environment and group, and a valid
// object name that never holds the student's id.
func TestHomeName(t *testing.T) {
	names := map[string]string{
		"default":       HomeName("dev", "alice@example.org", ""),
		"group":         HomeName("dev", "alice@example.org", "netsec"),
		"other student": HomeName("dev", "bob@example.org", ""),
		"other env":     HomeName("prod", "alice@example.org", ""),
	}
	seen := map[string]string{}
	for what, n := range names {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			t.Errorf("%s: %q is no object name: %v", what, n, errs)
		}
		if strings.Contains(n, "alice") || strings.Contains(n, "bob") {
			t.Errorf("%s: %q holds the student's id", what, n)
		}
		if other, dup := seen[n]; dup {
			t.Errorf("%s and %s share the home %q", what, other, n)
		}
		seen[n] = what
	}
	if n := names["default"]; n != HomeName("dev", "alice@example.org", "") {
		t.Errorf("HomeName is not stable: %q", n)
	}
	if !strings.HasSuffix(names["group"], "-netsec") {
		t.Errorf("a group's home %q does not end in its group", names["group"])
	}
}

// The home claim is the student's, labelled like every labkeep object but
// with no session and no owner, so nothing that ends a session deletes it.
func TestHomeClaimOutlivesTheSession(t *testing.T) {
	b := testBuilder(t, "shell-home")
	b.cfg.HomeStorageClass = "homes"
	pvc := b.homeClaim()
	if pvc.Name != HomeName("dev", "alice@example.org", "") || pvc.Namespace != "ns" {
		t.Errorf("claim %s/%s", pvc.Namespace, pvc.Name)
	}
	want := map[string]string{LabelEnv: "dev", LabelStudent: StudentHash("alice@example.org"), LabelRole: RoleHome, LabelHome: "", "app.kubernetes.io/managed-by": "labkeep"}
	if diff := cmp.Diff(want, pvc.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if len(pvc.OwnerReferences) != 0 {
		t.Errorf("the home has owners: %v", pvc.OwnerReferences)
	}
	if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse("2Gi")) != 0 {
		t.Errorf("size %s, want the lab's 2Gi", got.String())
	}
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != "homes" {
		t.Errorf("storage class %v, want homes", pvc.Spec.StorageClassName)
	}
	if diff := cmp.Diff([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, pvc.Spec.AccessModes); diff != "" {
		t.Errorf("access modes (-want +got):\n%s", diff)
	}
	b.cfg.HomeStorageClass = ""
	if sc := b.homeClaim().Spec.StorageClassName; sc != nil {
		t.Errorf("storage class %q without a setting; want the cluster's default", *sc)
	}
}

// In a Pod lab the workspace container, and only it, mounts the home at
// the lab's path; a lab without a home mounts none.
func TestWorkspaceMountsTheHome(t *testing.T) {
	pod := built(t, testBuilder(t, "shell-home"))
	claim := HomeName("dev", "alice@example.org", "")
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "home" })
	if i < 0 || pod.Spec.Volumes[i].PersistentVolumeClaim == nil || pod.Spec.Volumes[i].PersistentVolumeClaim.ClaimName != claim {
		t.Fatalf("no home volume of claim %s in %+v", claim, pod.Spec.Volumes)
	}
	mounts := map[string][]corev1.VolumeMount{}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		for _, m := range c.VolumeMounts {
			if m.Name == "home" {
				mounts[c.Name] = append(mounts[c.Name], m)
			}
		}
	}
	if diff := cmp.Diff(map[string][]corev1.VolumeMount{"workspace": {{Name: "home", MountPath: "/root"}}}, mounts); diff != "" {
		t.Errorf("home mounts by container (-want +got):\n%s", diff)
	}
	for _, v := range built(t, testBuilder(t, "shell")).Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			t.Errorf("a lab without a home mounts claim %s", v.PersistentVolumeClaim.ClaimName)
		}
	}
}

// In a VM lab the home node's VM, and only it, gets the home as a second
// disk with a serial the guest finds it by, and cloud-init formats it on
// first use and mounts it at the lab's path.
func TestVMGetsTheHomeDisk(t *testing.T) {
	b := testBuilder(t, "cluster-home")
	// A vm lab's home group is vm-<group>: it holds a disk image, which a
	// pod lab's home never shares.
	claim := HomeName("dev", "alice@example.org", "vm-netsec")
	anchor := b.anchor()
	for _, n := range b.lab.Nodes {
		spec := b.vm(n, anchor).Spec.Template.Spec
		var disks []kubevirtv1.Disk
		for _, d := range spec.Domain.Devices.Disks {
			if d.Name == "home" {
				disks = append(disks, d)
			}
		}
		var claims []string
		for _, v := range spec.Volumes {
			if v.PersistentVolumeClaim != nil {
				claims = append(claims, v.Name+"="+v.PersistentVolumeClaim.ClaimName)
			}
		}
		var ud struct {
			FSSetup []map[string]any `json:"fs_setup"`
			Mounts  [][]string       `json:"mounts"`
		}
		if err := yaml.Unmarshal([]byte(b.cloudInit(n, anchor).StringData["userdata"]), &ud); err != nil {
			t.Fatalf("%s: cloud-init user data: %v", n.Name, err)
		}
		if n.Name != "worker-1" {
			if len(disks)+len(claims)+len(ud.FSSetup)+len(ud.Mounts) != 0 {
				t.Errorf("%s is not the home node but has disks %v, claims %v, fs_setup %v, mounts %v", n.Name, disks, claims, ud.FSSetup, ud.Mounts)
			}
			continue
		}
		if len(disks) != 1 || disks[0].Serial != HomeDiskSerial || disks[0].Disk == nil || disks[0].Disk.Bus != kubevirtv1.DiskBusVirtio {
			t.Errorf("home disks %+v; want one virtio disk with serial %s", disks, HomeDiskSerial)
		}
		if diff := cmp.Diff([]string{"home=" + claim}, claims); diff != "" {
			t.Errorf("claims (-want +got):\n%s", diff)
		}
		wantFS := []map[string]any{{"label": HomeDiskSerial, "filesystem": "ext4", "device": "/dev/disk/by-id/virtio-" + HomeDiskSerial, "partition": "auto", "overwrite": false}}
		if diff := cmp.Diff(wantFS, ud.FSSetup); diff != "" {
			t.Errorf("fs_setup (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([][]string{{"LABEL=" + HomeDiskSerial, "/home/student", "ext4", "defaults,nofail", "0", "2"}}, ud.Mounts); diff != "" {
			t.Errorf("mounts (-want +got):\n%s", diff)
		}
	}
}
