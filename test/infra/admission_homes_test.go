package infra_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/session"
	"labkeep/shared/workspacekey"
)

// The policy's sentences for a claim that is no student's home
// (admission-policy.yaml, its start), for a home past the parameters'
// size or classes, and for a delete of a claim that is not one of the
// functions' environment's homes.
const (
	refusedHome       = "a PersistentVolumeClaim must be a student's home"
	refusedHomeBounds = "a student's home asks for at most homeMaxSize"
	refusedDelete     = "the functions delete only their own environment's homes"
	refusedReader     = "a home reader (labkeep.io/role home-reader) must be labkeep's"
)

var pvcGVR = schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}

// defaultClass is the default StorageClass the homes test makes.
const defaultClass = "homes-default"

// Students' homes under admission-policy.yaml on the real API server
// (rbac.yaml, the functions impersonated): labkeep's own sessions of a
// Pod lab and a VM lab that keep a home, and of one that keeps a group's
// home, are created by Provision, their homes with them; a claim that is
// not a student's home as labkeep makes it, and a Pod or VM naming
// another student's home (or its own student's in another environment,
// or a pool instance naming any), are refused with the policy's
// sentence; so is a home past the parameters' homeMaxSize (10Gi) or of a
// StorageClass they do not name, and a delete of a claim that is not a
// home of the functions' own environment. Crafted objects are created
// (and claims deleted) with dryRun=All.
func TestAdmissionAdmitsOnlyTheStudentsOwnHome(t *testing.T) {
	ctx := context.Background()
	place, env, admin, fnRC := underAdmissionParams(t, "home", map[string]string{"homeStorageClasses": "fast-local " + defaultClass})
	// The cluster's default class, which the API server writes into a
	// claim that names none (labkeep's own, without
	// LABKEEP_HOME_STORAGE_CLASS), before the policy sees it.
	if _, err := admin.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: defaultClass, Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner: "example.org/none",
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.StorageV1().StorageClasses().Delete(context.Background(), defaultClass, metav1.DeleteOptions{})
	})
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
		{"a home of homeMaxSize", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("10Gi")
		}), ""},
		{"a home past homeMaxSize", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("10241Mi")
		}), refusedHomeBounds},
		{"a home of a StorageClass of homeStorageClasses", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = ptr("fast-local") }), ""},
		{"a home of the default class homeStorageClasses lists", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = nil }), ""},
		{"a home of another StorageClass", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = ptr("premium") }), refusedHomeBounds},
		{"a home of no class (any classless volume)", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.StorageClassName = ptr("") }), refusedHomeBounds},
	})

	// Deletes: the claims exist (labkeep's own homes, made above; the
	// others made by the admin, whom the policy does not bind).
	foreign := home("other-env", student, "")
	foreign.Labels[kube.LabelEnv] = "other-env"
	scratch := home(env, student, "")
	scratch.Name, scratch.Labels[kube.LabelRole] = "scratch-"+env, "scratch"
	for _, c := range []*corev1.PersistentVolumeClaim{foreign, scratch} {
		if _, err := admin.CoreV1().PersistentVolumeClaims(place.Sessions).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deleteClaim := func(name string) error {
		return fnDyn.Resource(pvcGVR).Namespace(place.Sessions).Delete(ctx, name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	}
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		err := deleteClaim(foreign.Name)
		return err != nil && strings.Contains(err.Error(), refusedDelete), "the delete policy does not refuse yet: " + fmt.Sprint(err)
	})
	for _, tc := range []struct{ name, claim, refused string }{
		{"its own environment's home", kube.HomeName(env, student, ""), ""},
		{"its own environment's group home", kube.HomeName(env, student, "netsec"), ""},
		{"another environment's home", foreign.Name, refusedDelete},
		{"a claim of its environment that is no home", scratch.Name, refusedDelete},
	} {
		t.Run("delete "+tc.name, func(t *testing.T) { wantAdmission(t, deleteClaim(tc.claim), tc.refused) })
	}

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

	// The home's reader, as labkeep makes it for a download while no
	// session holds the home: admitted (this cluster has no node, so the
	// download then waits for it to start until the request ends, and
	// deletes it), and copies of it changed each one way refused.
	reader := ownReader(t, cluster, place.Sessions, student, ownHome)
	readerOf := func(edit func(p *corev1.Pod, c *corev1.Container)) crafted {
		p := restampPod(reader, reader.Name)
		if edit != nil {
			edit(p, &p.Spec.Containers[0])
		}
		return crafted{podsGVR, p}
	}
	otherHome := kube.HomeName(env, otherStudent, "")
	testAdmission(t, fnDyn, place.Sessions, []admissionCase{
		{"labkeep's own home reader", readerOf(nil), ""},
		{"a reader of its student's group home", readerOf(func(p *corev1.Pod, _ *corev1.Container) {
			p.Name, p.Spec.Volumes[0].PersistentVolumeClaim.ClaimName = kube.HomeReaderName(kube.HomeName(env, student, "netsec")), kube.HomeName(env, student, "netsec")
		}), ""},
		{"a reader of another student's home", readerOf(func(p *corev1.Pod, _ *corev1.Container) {
			p.Name, p.Spec.Volumes[0].PersistentVolumeClaim.ClaimName = kube.HomeReaderName(otherHome), otherHome
		}), refusedVolume},
		{"a reader named for another home than it mounts", readerOf(func(p *corev1.Pod, _ *corev1.Container) {
			p.Name = kube.HomeReaderName(kube.HomeName(env, student, "netsec"))
		}), refusedReader},
		{"a reader of a session", readerOf(func(p *corev1.Pod, _ *corev1.Container) {
			p.Labels = maps.Clone(p.Labels)
			p.Labels[kube.LabelSession] = own.ID
		}), refusedReader},
		{"a reader whose claim is writable", readerOf(func(p *corev1.Pod, _ *corev1.Container) {
			p.Spec.Volumes[0].PersistentVolumeClaim.ReadOnly = false
		}), refusedReader},
		{"a reader whose mount is writable", readerOf(func(_ *corev1.Pod, c *corev1.Container) { c.VolumeMounts[0].ReadOnly = false }), refusedReader},
		{"a reader with a writable root", readerOf(func(_ *corev1.Pod, c *corev1.Container) { c.SecurityContext.ReadOnlyRootFilesystem = ptr(false) }), refusedReader},
		{"a reader running another command", readerOf(func(_ *corev1.Pod, c *corev1.Container) { c.Command = []string{"sh", "-c", "tar czf - /home-archive"} }), refusedReader},
		{"a reader adding a workspace capability but DAC_OVERRIDE", readerOf(func(_ *corev1.Pod, c *corev1.Container) {
			c.SecurityContext.Capabilities.Add = append(c.SecurityContext.Capabilities.Add, "CHOWN")
		}), refusedReader},
		{"a reader with an environment", readerOf(func(_ *corev1.Pod, c *corev1.Container) { c.Env = []corev1.EnvVar{{Name: "X", Value: "1"}} }), refusedReader},
		{"a reader with a second container", readerOf(func(p *corev1.Pod, c *corev1.Container) {
			second := c.DeepCopy()
			second.Name = "second"
			p.Spec.Containers = append(p.Spec.Containers, *second)
		}), refusedReader},
		{"a workspace Pod with a container named reader", pod(func(p *corev1.Pod, ws, _ *corev1.Container) {
			extra := ws.DeepCopy()
			extra.Name, extra.Ports = kube.ReaderContainer, nil
			p.Spec.Containers = append(p.Spec.Containers, *extra)
		}), refusedReader},
	})
}

// ownReader makes the home reader of student's home through the
// functions' own code (kube.Cluster.ArchiveIdleHome) and returns it as the
// API server stored it. With no node in this cluster the download waits
// for the reader to start until its request's deadline, and then deletes
// it.
func ownReader(t *testing.T, cluster *kube.Cluster, ns, student, home string) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	found := make(chan *corev1.Pod, 1)
	go func() {
		defer close(found)
		for ctx.Err() == nil {
			u, err := api.dyn.Resource(podsGVR).Namespace(ns).Get(ctx, kube.HomeReaderName(home), metav1.GetOptions{})
			var p corev1.Pod
			if err == nil && runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p) == nil {
				found <- &p
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	err := cluster.ArchiveIdleHome(ctx, student, home, io.Discard)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the download ended with %v; want it to wait for its reader to start until its deadline", err)
	}
	p, ok := <-found
	if !ok {
		t.Fatalf("the download's reader was never stored: %v", err)
	}
	if _, err := api.dyn.Resource(podsGVR).Namespace(ns).Get(context.Background(), p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the download left its reader %s behind (get: %v)", p.Name, err)
	}
	return p
}
