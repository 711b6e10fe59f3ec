package infra_test

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/session"
)

// The policy's message for a VM's volumes, as admission-policy.yaml
// writes it (its start).
const refusedVMVolumes = "a VirtualMachine's volumes may only be a containerDisk, its node's root DataVolume"

// What the functions' ServiceAccount may give a VM as disks, under
// admission-policy.yaml on the real API server (KubeVirt's own CRDs,
// rbac.yaml, the functions impersonated). Whatever a volume names reaches
// the guest, so only labkeep's own volumes pass: a containerDisk, the
// node's root DataVolume (cloned from a golden PVC) and cloud-init from
// the node's own cloud-init Secret, in the node's own VM.
//   - every VM labkeep's builder makes, for every VM lab of infra/base/labs.yaml
//     and the golden-PVC labs, for a student's session and a pool
//     instance (accessCredentials), is created for real by Provision;
//   - a copy of labkeep's own VM (containerDisk, golden PVC) changed in one
//     way is refused with the policy's sentence: a secret, serviceAccount,
//     configMap, hostDisk, persistentVolumeClaim or cloudInitConfigDrive
//     volume, cloud-init from another Secret or with network data from
//     one, another session's DataVolume, a volume with a second source, a
//     disk template named for another session, cloning a PVC of the
//     sessions namespace or importing from a registry, a VM not named for
//     its node; a foreign containerDisk is refused by the image rule;
//   - a VM carrying another session's labels and naming its Secrets must
//     take that session's VM's name, which is taken.
//
// Each crafted VM is created with dryRun=All (admission runs, nothing is
// stored).
func TestAdmissionLimitsVMVolumes(t *testing.T) {
	place, env, admin, fnRC := underAdmissionPolicy(t, "vols")
	fnDyn := dynamic.NewForConfigOrDie(fnRC)
	cfg := kube.DefaultConfig()
	cfg.Namespace, cfg.Env, cfg.MaxLifetime = place.Sessions, env, time.Hour
	cfg.PlatformSSHKeys = []string{"ssh-ed25519 AAAAgrader grader@platform"}
	cluster, err := kube.NewForConfig(cfg, fnRC)
	if err != nil {
		t.Fatal(err)
	}

	golden, err := labs.Parse([]byte(goldenLabs))
	if err != nil {
		t.Fatal(err)
	}
	var vmLabs []labs.Lab
	for _, lab := range append(labsOf(sampleLabs(t)), labsOf(golden)...) {
		if lab.Kind == labs.KindVM {
			vmLabs = append(vmLabs, lab)
		}
	}
	// provision creates a session of lab as labkeep does, a pool instance
	// (no student key: its VMs take their keys live) when pool is set,
	// and returns it with its VMs as stored.
	provision := func(t *testing.T, lab labs.Lab, pool bool) (session.Session, []*unstructured.Unstructured) {
		t.Helper()
		s := studentSession(lab)
		if pool {
			s = poolSession(lab)
		}
		provisionOwn(t, cluster, s, lab)
		var vms []*unstructured.Unstructured
		for _, n := range lab.Nodes {
			vms = append(vms, stored(t, vmGVR, place.Sessions, session.NodeName(s.ID, n.Name)))
		}
		return s, vms
	}
	// editVolumes is a copy of from, keeping its name, whose volumes edit
	// changes.
	editVolumes := func(from *unstructured.Unstructured, edit func(vols []any) []any) crafted {
		return vmCopies(from, from.GetName())(func(u *unstructured.Unstructured) {
			vols, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "volumes")
			_ = unstructured.SetNestedSlice(u.Object, edit(vols), "spec", "template", "spec", "volumes")
		})
	}
	// withVolume is a copy of from with one more volume of source.
	withVolume := func(from *unstructured.Unstructured, source string, spec map[string]any) crafted {
		return editVolumes(from, func(vols []any) []any {
			return append(vols, map[string]any{"name": "extra", source: spec})
		})
	}

	// The baselines the crafted VMs are made from. The policy is active
	// a moment after it is created: wait until it refuses a copy of
	// labkeep's own VM with a secret volume.
	vmLab, _ := sampleLabs(t).Get("linux-vm")
	goldenLab, _ := golden.Get("golden-vm")
	own, ownVMs := provision(t, vmLab, false)
	probe := withVolume(ownVMs[0], "secret", map[string]any{"secretName": "labkeep-secrets"})
	awaitPolicy(t, fnDyn, vmGVR, place.Sessions, probe.obj, refusedVMVolumes)
	logTypeWarnings(t, admin)

	t.Run("labkeep's own VMs are admitted", func(t *testing.T) {
		for _, lab := range vmLabs {
			for _, pool := range []bool{false, true} {
				name := lab.Name
				if pool {
					name += " pool instance"
				}
				t.Run(name, func(t *testing.T) {
					_, vms := provision(t, lab, pool)
					t.Logf("%d VMs created", len(vms))
				})
			}
		}
	})

	_, goldenVMs := provision(t, goldenLab, false)
	other, _ := provision(t, goldenLab, false)
	vm, goldenVM := ownVMs[0], goldenVMs[0]
	otherNode := goldenLab.Nodes[0].Name
	// The copies keep the real VMs' names (the policy ties them to the
	// Secrets and disks they name), so the real ones go.
	for _, u := range []*unstructured.Unstructured{vm, goldenVM} {
		removeOwn(t, vmGVR, place.Sessions, u.GetName())
	}
	virtualMachine, goldenVirtualMachine := vmCopies(vm, vm.GetName()), vmCopies(goldenVM, goldenVM.GetName())

	// replaceVolume is a copy of from whose volume name has only source.
	replaceVolume := func(from *unstructured.Unstructured, name, source string, spec map[string]any) crafted {
		return editVolumes(from, func(vols []any) []any {
			for i, v := range vols {
				if v.(map[string]any)["name"] == name {
					vols[i] = map[string]any{"name": name, source: spec}
					return vols
				}
			}
			t.Fatalf("VM %s has no volume %q", from.GetName(), name)
			return nil
		})
	}
	// editDiskTemplate is a copy of the golden VM whose one disk template
	// edit changes.
	editDiskTemplate := func(edit func(d map[string]any)) crafted {
		return goldenVirtualMachine(func(u *unstructured.Unstructured) {
			dvts, _, _ := unstructured.NestedSlice(u.Object, "spec", "dataVolumeTemplates")
			if len(dvts) != 1 {
				t.Fatalf("golden VM has %d dataVolumeTemplates, want 1", len(dvts))
			}
			edit(dvts[0].(map[string]any))
			_ = unstructured.SetNestedSlice(u.Object, dvts, "spec", "dataVolumeTemplates")
		})
	}
	cloudInit := func(secret string) map[string]any {
		return map[string]any{"secretRef": map[string]any{"name": secret}}
	}
	ownCloudInit := session.CloudInitName(own.ID, vmLab.Nodes[0].Name)
	otherRoot := session.NodeName(other.ID, otherNode) + "-root"
	// The other session's VM as a compromised function would write it:
	// its labels, its name, its cloud-init Secret.
	otherLabels := func(u *unstructured.Unstructured) {
		l := u.GetLabels()
		l[kube.LabelSession] = other.ID
		u.SetLabels(l)
		u.SetName(session.NodeName(other.ID, otherNode))
		_ = unstructured.SetNestedField(u.Object, other.ID, "spec", "template", "metadata", "labels", kube.LabelSession)
		vols, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "volumes")
		for _, v := range vols {
			if ci, ok := v.(map[string]any)["cloudInitNoCloud"].(map[string]any); ok {
				ci["secretRef"] = map[string]any{"name": session.CloudInitName(other.ID, otherNode)}
			}
		}
		_ = unstructured.SetNestedSlice(u.Object, vols, "spec", "template", "spec", "volumes")
	}

	testAdmission(t, fnDyn, place.Sessions, []admissionCase{
		{"labkeep's own containerDisk VM", virtualMachine(nil), ""},
		{"labkeep's own golden-PVC VM", goldenVirtualMachine(nil), ""},
		{"a secret volume (the database Secret)", withVolume(vm, "secret", map[string]any{"secretName": "labkeep-secrets"}), refusedVMVolumes},
		{"a serviceAccount volume", withVolume(vm, "serviceAccount", map[string]any{"serviceAccountName": "default"}), refusedVMVolumes},
		{"a configMap volume", withVolume(vm, "configMap", map[string]any{"name": "labkeep-admission"}), refusedVMVolumes},
		{"a hostDisk", withVolume(vm, "hostDisk", map[string]any{"path": "/var/lib/kubelet/disk.img", "type": "DiskOrCreate"}), refusedVMVolumes},
		{"a persistentVolumeClaim of another session", withVolume(vm, "persistentVolumeClaim", map[string]any{"claimName": otherRoot}), refusedVMVolumes},
		{"another session's DataVolume as root", replaceVolume(goldenVM, "root", "dataVolume", map[string]any{"name": otherRoot}), refusedVMVolumes},
		{"another session's DataVolume besides the root", withVolume(vm, "dataVolume", map[string]any{"name": otherRoot}), refusedVMVolumes},
		{"cloud-init from another session's cloud-init Secret", replaceVolume(vm, "cloudinit", "cloudInitNoCloud",
			cloudInit(session.CloudInitName(other.ID, otherNode))), refusedVMVolumes},
		{"cloud-init from the database Secret", replaceVolume(vm, "cloudinit", "cloudInitNoCloud", cloudInit("labkeep-secrets")), refusedVMVolumes},
		{"cloud-init with network data from another Secret", replaceVolume(vm, "cloudinit", "cloudInitNoCloud", map[string]any{
			"secretRef":            map[string]any{"name": ownCloudInit},
			"networkDataSecretRef": map[string]any{"name": "labkeep-secrets"},
		}), refusedVMVolumes},
		{"cloudInitConfigDrive from the node's own cloud-init Secret", replaceVolume(vm, "cloudinit", "cloudInitConfigDrive", cloudInit(ownCloudInit)), refusedVMVolumes},
		{"a second cloud-init volume from another Secret", withVolume(vm, "cloudInitNoCloud", cloudInit("labkeep-secrets")), refusedVMVolumes},
		{"a containerDisk volume also carrying a secret", editVolumes(vm, func(vols []any) []any {
			for _, v := range vols {
				if m := v.(map[string]any); m["containerDisk"] != nil {
					m["secret"] = map[string]any{"secretName": "labkeep-secrets"}
				}
			}
			return vols
		}), refusedVMVolumes},
		{"a containerDisk of a foreign image", editVolumes(vm, func(vols []any) []any {
			for _, v := range vols {
				if cd, ok := v.(map[string]any)["containerDisk"].(map[string]any); ok {
					cd["image"] = "docker.io/evil/disk:1"
				}
			}
			return vols
		}), refusedImage},
		{"a disk template named for another session", editDiskTemplate(func(d map[string]any) {
			_ = unstructured.SetNestedField(d, otherRoot, "metadata", "name")
		}), refusedVMVolumes},
		{"a disk template cloning another session's root disk", editDiskTemplate(func(d map[string]any) {
			_ = unstructured.SetNestedMap(d, map[string]any{"namespace": place.Sessions, "name": otherRoot}, "spec", "source", "pvc")
		}), refusedVMVolumes},
		{"a disk template cloning a PVC of its own namespace by default", editDiskTemplate(func(d map[string]any) {
			_ = unstructured.SetNestedMap(d, map[string]any{"namespace": "", "name": otherRoot}, "spec", "source", "pvc")
		}), refusedVMVolumes},
		{"a disk template importing from a registry", editDiskTemplate(func(d map[string]any) {
			_ = unstructured.SetNestedMap(d, map[string]any{"registry": map[string]any{"url": "docker://docker.io/evil/disk:1"}}, "spec", "source")
		}), refusedVMVolumes},
		{"a disk template cloning the golden PVC and importing from a registry", editDiskTemplate(func(d map[string]any) {
			_ = unstructured.SetNestedMap(d, map[string]any{"url": "docker://docker.io/evil/disk:1"}, "spec", "source", "registry")
		}), refusedVMVolumes},
		{"labkeep's volumes in a VM not named for its node", virtualMachine(func(u *unstructured.Unstructured) {
			u.SetName("crafted")
		}), refusedVMVolumes},
		{"labkeep's volumes in a VM without a node label", virtualMachine(func(u *unstructured.Unstructured) {
			l := u.GetLabels()
			delete(l, kube.LabelNode)
			u.SetLabels(l)
		}), refusedVMVolumes},
		// The name is what ties a VM's labels to one session: passing the
		// policy with another session's Secrets takes that session's VM's
		// name, and the API server refuses it as taken.
		{"another session's labels, name and cloud-init Secret", virtualMachine(otherLabels), nameTaken},
	})
}
