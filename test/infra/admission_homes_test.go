package infra_test

import (
	"context"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/session"
	"labkeep/shared/workspacekey"
)

// refusedHome is the policy's sentence for a claim that is no student's
// home (admission-policy.yaml, its start).
const refusedHome = "a PersistentVolumeClaim must be a student's home"

var pvcGVR = schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}

// Students' homes under admission-policy.yaml on the real API server
// (rbac.yaml, the functions impersonated): labkeep's own sessions of a
// Pod lab and a VM lab that keep a home, and of one that keeps a group's
// home, are created by Provision, their homes with them; a claim that is
// not a student's home as labkeep makes it, and a Pod or VM naming
// another student's home (or its own student's in another environment,
// or a pool instance naming any), are refused with the policy's
// sentence. Crafted objects are created with dryRun=All.
func TestAdmissionAdmitsOnlyTheStudentsOwnHome(t *testing.T) {
	ctx := context.Background()
	place, env, admin, fnRC := underAdmissionPolicy(t, "home")
	fnDyn := dynamic.NewForConfigOrDie(fnRC)
	cfg := kube.DefaultConfig()
	cfg.Namespace, cfg.Env, cfg.MaxLifetime = place.Sessions, env, time.Hour
	cfg.WorkspaceKey = workspacekey.Key{Secret: []byte("workspace key"), Env: env}
	cluster, err := kube.NewForConfig(cfg, fnRC)
	if err != nil {
		t.Fatal(err)
	}
	cat := sampleLabs(t)
	withHome := func(name string, h labs.Home) labs.Lab {
		t.Helper()
		l, ok := cat.Get(name)
		if !ok {
			t.Fatalf("infra/base/labs.yaml has no lab %s", name)
		}
		if h.Node == "" && l.Kind == labs.KindVM {
			h.Node = l.Nodes[0].Name
		}
		l.Home = &h
		return l
	}
	shell := withHome("shell", labs.Home{Size: "1Gi", MountPath: "/root"})
	grouped := withHome("shell", labs.Home{Size: "1Gi", MountPath: "/root", Group: "netsec"})
	vmLab := withHome("linux-vm", labs.Home{Size: "1Gi", MountPath: "/home/student"})

	const student, otherStudent = "student@example.org", "other@example.org"
	home := func(envName, who, group string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: kube.HomeName(envName, who, group), Labels: map[string]string{
				kube.LabelEnv: env, kube.LabelStudent: kube.StudentHash(who), kube.LabelRole: kube.RoleHome, kube.LabelHome: group,
				"app.kubernetes.io/managed-by": "labkeep"}},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}
	}
	claim := func(edit func(c *corev1.PersistentVolumeClaim)) crafted {
		c := home(env, otherStudent, "")
		if edit != nil {
			edit(c)
		}
		return crafted{pvcGVR, c}
	}
	awaitPolicy(t, fnDyn, pvcGVR, place.Sessions, claim(func(c *corev1.PersistentVolumeClaim) { c.Labels[kube.LabelSession] = "s" }).obj, refusedHome)
	logTypeWarnings(t, admin)

	own := provisionOwn(t, cluster, studentSession(shell), shell)
	provisionOwn(t, cluster, studentSession(grouped), grouped)
	ownVM := provisionOwn(t, cluster, studentSession(vmLab), vmLab)
	for _, name := range []string{kube.HomeName(env, student, ""), kube.HomeName(env, student, "netsec"), kube.HomeName(env, student, "vm")} {
		c, err := admin.CoreV1().PersistentVolumeClaims(place.Sessions).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("labkeep's own home %s was not made: %v", name, err)
		}
		if len(c.OwnerReferences) != 0 || c.Labels[kube.LabelSession] != "" {
			t.Errorf("home %s belongs to a session: owners %v, labels %v", name, c.OwnerReferences, c.Labels)
		}
	}

	testAdmission(t, fnDyn, place.Sessions, []admissionCase{
		{"another student's home as labkeep makes it", claim(nil), ""},
		{"a group's home as labkeep makes it", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Name, c.Labels[kube.LabelHome] = kube.HomeName(env, otherStudent, "db-101"), "db-101"
		}), ""},
		{"a home named for another student than its label", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Name = kube.HomeName(env, "third@example.org", "")
		}), refusedHome},
		{"a home named for another environment", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Name = kube.HomeName("other-env", otherStudent, "")
		}), refusedHome},
		{"a home named for another group than its label", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Labels[kube.LabelHome] = "netsec"
		}), refusedHome},
		{"a home of a session", claim(func(c *corev1.PersistentVolumeClaim) { c.Labels[kube.LabelSession] = own.ID }), refusedHome},
		{"a claim of another role", claim(func(c *corev1.PersistentVolumeClaim) { c.Labels[kube.LabelRole] = "workspace" }), refusedHome},
		{"a claim with no role", claim(func(c *corev1.PersistentVolumeClaim) { delete(c.Labels, kube.LabelRole) }), refusedLabels},
		{"a home binding a chosen volume", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "pv-of-someone" }), refusedHome},
		{"a home selecting volumes", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"owner": "someone"}}
		}), refusedHome},
		{"a home cloned from the student's own home", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: kube.HomeName(env, student, "")}
		}), refusedHome},
		{"a home shared by many nodes", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
		}), refusedHome},
		{"a home as a block device", claim(func(c *corev1.PersistentVolumeClaim) {
			block := corev1.PersistentVolumeBlock
			c.Spec.VolumeMode = &block
		}), refusedHome},
	})

	// Crafted Pods and VMs keep the real ones' names (the policy ties a
	// name to its session's Secrets), so the real ones go.
	node := shell.Nodes[0].Name
	var workspace corev1.Pod
	typed(t, stored(t, podsGVR, place.Sessions, session.NodeName(own.ID, node)), &workspace)
	removeOwn(t, podsGVR, place.Sessions, workspace.Name)
	vmName := session.NodeName(ownVM.ID, vmLab.Nodes[0].Name)
	vm := stored(t, vmGVR, place.Sessions, vmName)
	removeOwn(t, vmGVR, place.Sessions, vmName)
	pod := podCopies(&workspace, workspace.Name)
	homeClaimed := func(name string) func(p *corev1.Pod, _, _ *corev1.Container) {
		return func(p *corev1.Pod, _, _ *corev1.Container) {
			for i := range p.Spec.Volumes {
				if c := p.Spec.Volumes[i].PersistentVolumeClaim; c != nil {
					c.ClaimName = name
					return
				}
			}
			t.Fatalf("labkeep's Pod mounts no home")
		}
	}
	vmHome := func(name string) crafted {
		return vmCopies(vm, vmName)(func(u *unstructured.Unstructured) {
			vols, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "volumes")
			found := false
			for _, v := range vols {
				if c, ok := v.(map[string]any)["persistentVolumeClaim"].(map[string]any); ok {
					c["claimName"], found = name, true
				}
			}
			if !found {
				t.Fatalf("labkeep's VM has no home disk")
			}
			_ = unstructured.SetNestedSlice(u.Object, vols, "spec", "template", "spec", "volumes")
		})
	}
	ownHome := kube.HomeName(env, student, "")
	testAdmission(t, fnDyn, place.Sessions, []admissionCase{
		{"labkeep's own workspace Pod with its student's home", pod(nil), ""},
		{"its student's group home", pod(homeClaimed(kube.HomeName(env, student, "netsec"))), ""},
		{"another student's home", pod(homeClaimed(kube.HomeName(env, otherStudent, ""))), refusedVolume},
		{"another student's group home", pod(homeClaimed(kube.HomeName(env, otherStudent, "netsec"))), refusedVolume},
		{"its student's home in another environment", pod(homeClaimed(kube.HomeName("other-env", student, ""))), refusedVolume},
		{"a claim whose name only starts like its student's home", pod(homeClaimed(ownHome + "0")), refusedVolume},
		{"its student's VM home (a disk image)", pod(homeClaimed(kube.HomeName(env, student, "vm"))), refusedVolume},
		{"its student's VM group home", pod(homeClaimed(kube.HomeName(env, student, "vm-netsec"))), refusedVolume},
		{"its student's home in a pool instance", pod(func(p *corev1.Pod, ws, g *corev1.Container) {
			p.Labels = maps.Clone(p.Labels)
			delete(p.Labels, kube.LabelStudent)
			p.Labels[kube.LabelPool] = kube.PoolWarm
		}), refusedVolume},
		{"labkeep's own VM with its student's home", vmHome(kube.HomeName(env, student, "vm")), ""},
		{"a VM with its student's VM group home", vmHome(kube.HomeName(env, student, "vm-netsec")), ""},
		{"a VM with its student's Pod home (files, no disk image)", vmHome(ownHome), refusedVMVolumes},
		{"a VM with another student's home", vmHome(kube.HomeName(env, otherStudent, "vm")), refusedVMVolumes},
		{"a VM with its student's home in another environment", vmHome(kube.HomeName("other-env", student, "vm")), refusedVMVolumes},
	})
}
