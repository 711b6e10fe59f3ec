package infra_test

import (
	"context"
	"maps"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/session"
	"labkeep/shared/workspacekey"
)

// The policy's messages for a Pod's Secrets and name, as
// admission-policy.yaml writes them (their start).
const (
	refusedPodSecrets = "a Pod may read only its node's Secret"
	refusedPodName    = "a Pod must be named lk-<labkeep.io/session>-<labkeep.io/node>"
	refusedPullSecret = "no image pull Secret"
)

// What Secrets the functions' ServiceAccount may give a workspace Pod,
// under admission-policy.yaml on the real API server (rbac.yaml, the
// functions impersonated). The workspace's root reads whatever its Pod
// mounts or puts in its environment, so only labkeep's own references
// pass: the node's cloud-init Secret as a volume, that Secret's cleanup
// token (the session's own) in guardian's environment; and no
// persistentVolumeClaim (a VM session's disk).
//   - every workspace Pod labkeep's builder makes, for every Pod lab of
//     infra/base/labs.yaml and one opting in to NET_RAW, for a student's
//     session and a pool instance, with and without guardian's webhook,
//     is created for real by Provision;
//   - a copy of labkeep's own Pod changed in one way is refused with the
//     policy's sentence: a secret volume of another session's cloud-init
//     or keys Secret or of the database Secret, a projected Secret,
//     another session's disk as a persistentVolumeClaim, a
//     secretKeyRef or envFrom secretRef in the workspace or in an added
//     init container, guardian's token in the workspace, guardian taking
//     another session's cleanup token or another key of its own Secret
//     as its token, guardian reading another Secret, a Job's Pod mounting
//     a Secret, a Pod not named for its node;
//   - a Pod carrying another session's labels and naming its Secret must
//     take that session's Pod's name, which is taken;
//   - a VM booting a kernel from an image outside the allowlist is
//     refused, one from the allowlist admitted; a Pod's imagePullSecrets
//     and a VM's containerDisk or kernelBoot imagePullSecret are refused.
//
// Each crafted object is created with dryRun=All (admission runs, nothing
// is stored).
func TestAdmissionLimitsPodSecrets(t *testing.T) {
	ctx := context.Background()
	place, env, admin, fnRC := underAdmissionPolicy(t, "psec")
	fnDyn := dynamic.NewForConfigOrDie(fnRC)
	newCluster := func(t *testing.T, webhook bool) *kube.Cluster {
		t.Helper()
		cfg := kube.DefaultConfig()
		cfg.Namespace, cfg.Env, cfg.MaxLifetime = place.Sessions, env, time.Hour
		cfg.PlatformSSHKeys = []string{"ssh-ed25519 AAAAgrader grader@platform"}
		cfg.WorkspaceKey = workspacekey.Key{Secret: []byte("workspace key"), Env: env}
		if webhook {
			cfg.GuardianWebhookURL = "https://labkeep.example.org/guardianAlert"
		}
		c, err := kube.NewForConfig(cfg, fnRC)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	plain, hooked := newCluster(t, false), newCluster(t, true)

	catalog := sampleLabs(t)
	var podLabs []labs.Lab
	for _, lab := range labsOf(catalog) {
		if lab.Kind == labs.KindPod {
			podLabs = append(podLabs, lab)
		}
	}
	if len(podLabs) == 0 {
		t.Fatal("infra/base/labs.yaml has no Pod lab")
	}
	netLab := podLabs[0]
	netLab.Name, netLab.Capabilities = netLab.Name+"-net", []string{"NET_RAW"}
	podLabs = append(podLabs, netLab)

	// provision creates a session of lab as labkeep does (a pool instance
	// when pool is set) and returns it.
	provision := func(t *testing.T, c *kube.Cluster, lab labs.Lab, pool bool) session.Session {
		t.Helper()
		s := studentSession(lab)
		if pool {
			s = poolSession(lab)
			s.Pool = session.PoolIdle
		}
		return provisionOwn(t, c, s, lab)
	}

	// The baseline the crafted Pods are made from. The policy is active a
	// moment after it is created: wait until it refuses a copy of
	// labkeep's own Pod running a foreign image (another rule than the
	// ones under test, so each case below shows its own).
	shellLab := podLabs[0]
	own := provision(t, plain, shellLab, false)
	other := provision(t, plain, shellLab, false)
	node := shellLab.Nodes[0].Name
	var workspace corev1.Pod
	var anchor batchv1.Job
	typed(t, stored(t, podsGVR, place.Sessions, session.NodeName(own.ID, node)), &workspace)
	typed(t, stored(t, jobsGVR, place.Sessions, session.AnchorName(own.ID)), &anchor)
	// pod makes copies of labkeep's own workspace Pod (its name, labels
	// and owner); job of its anchor Job.
	pod, job := podCopies(&workspace, workspace.Name), jobCopies(&anchor, own.ID)
	secretVolume := func(name string) func(p *corev1.Pod, ws, _ *corev1.Container) {
		return func(p *corev1.Pod, ws, _ *corev1.Container) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "extra", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: name}}})
			ws.VolumeMounts = append(ws.VolumeMounts, corev1.VolumeMount{Name: "extra", MountPath: "/extra", ReadOnly: true})
		}
	}
	secretEnv := func(secret, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: "STOLEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key}}}
	}
	// initContainer is one more init container, confined as the
	// workspace is, with env.
	initContainer := func(p *corev1.Pod, ws *corev1.Container, edit func(c *corev1.Container)) {
		c := corev1.Container{Name: "init", Image: ws.Image, Command: []string{"true"}, SecurityContext: ws.SecurityContext.DeepCopy()}
		edit(&c)
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
	}
	ownCloudInit := session.CloudInitName(own.ID, node)
	otherCloudInit := session.CloudInitName(other.ID, node)
	probe := pod(func(_ *corev1.Pod, ws, _ *corev1.Container) { ws.Image = "docker.io/library/alpine:3.20" })
	awaitPolicy(t, fnDyn, podsGVR, place.Sessions, probe.obj, refusedImage)
	logTypeWarnings(t, admin)

	t.Run("labkeep's own Pods are admitted", func(t *testing.T) {
		for _, lab := range podLabs {
			for _, pool := range []bool{false, true} {
				for _, webhook := range []bool{false, true} {
					name := lab.Name
					if pool {
						name += " pool instance"
					}
					c := plain
					if webhook {
						name, c = name+" with guardian's webhook", hooked
					}
					t.Run(name, func(t *testing.T) {
						s := provision(t, c, lab, pool)
						p, err := admin.CoreV1().Pods(place.Sessions).Get(ctx, session.NodeName(s.ID, lab.Nodes[0].Name), metav1.GetOptions{})
						if err != nil {
							t.Fatalf("labkeep's own workspace Pod of %s was not created: %v", lab.Name, err)
						}
						t.Logf("Pod %s created with %d volumes", p.Name, len(p.Spec.Volumes))
					})
				}
			}
		}
	})

	// The crafted Pods keep the real Pod's name (the policy ties it to the
	// Secret it mounts), so the real one goes.
	removeOwn(t, podsGVR, place.Sessions, workspace.Name)

	testAdmission(t, fnDyn, place.Sessions, []admissionCase{
		{"labkeep's own workspace Pod", pod(nil), ""},
		{"another session's cloud-init Secret as the labkeep volume", pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			for i := range p.Spec.Volumes {
				if s := p.Spec.Volumes[i].Secret; s != nil && s.SecretName == ownCloudInit {
					s.SecretName = otherCloudInit
					return
				}
			}
			t.Fatalf("labkeep's Pod mounts no %s", ownCloudInit)
		}), refusedPodSecrets},
		{"another session's cloud-init Secret besides its own", pod(secretVolume(otherCloudInit)), refusedPodSecrets},
		{"another session's keys Secret", pod(secretVolume(session.SSHKeysName(other.ID, node))), refusedPodSecrets},
		{"its own node's keys Secret", pod(secretVolume(session.SSHKeysName(own.ID, node))), refusedPodSecrets},
		{"the database Secret", pod(secretVolume("labkeep-secrets")), refusedPodSecrets},
		{"a projected volume of another session's Secret", pod(func(p *corev1.Pod, ws, _ *corev1.Container) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "extra", VolumeSource: corev1.VolumeSource{
				Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{
					Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: otherCloudInit}},
				}}}}})
			ws.VolumeMounts = append(ws.VolumeMounts, corev1.VolumeMount{Name: "extra", MountPath: "/extra", ReadOnly: true})
		}), refusedVolume},
		{"another session's root disk as a persistentVolumeClaim", pod(func(p *corev1.Pod, ws, _ *corev1.Container) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "extra", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: session.NodeName(other.ID, "vm") + "-root"}}})
			ws.VolumeMounts = append(ws.VolumeMounts, corev1.VolumeMount{Name: "extra", MountPath: "/extra"})
		}), refusedVolume},
		{"a secretKeyRef to another session's Secret in the workspace", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.Env = append(ws.Env, secretEnv(otherCloudInit, "ssh-host-key"))
		}), refusedPodSecrets},
		{"guardian's cleanup token in the workspace", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.Env = append(ws.Env, secretEnv(ownCloudInit, kube.CleanupTokenKey))
		}), refusedPodSecrets},
		{"guardian taking another session's cleanup token", pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			cleanupTokenFrom(t, g, otherCloudInit, kube.CleanupTokenKey)
		}), refusedPodSecrets},
		{"guardian taking another key of its own Secret as its cleanup token", pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			cleanupTokenFrom(t, g, ownCloudInit, "grading-token")
		}), refusedPodSecrets},
		{"guardian reading the database Secret", pod(func(_ *corev1.Pod, _, g *corev1.Container) {
			g.Env = append(g.Env, secretEnv("labkeep-secrets", "password"))
		}), refusedPodSecrets},
		{"an envFrom secretRef of its own cloud-init Secret", pod(func(_ *corev1.Pod, ws, _ *corev1.Container) {
			ws.EnvFrom = append(ws.EnvFrom, corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: ownCloudInit}}})
		}), refusedPodSecrets},
		{"an init container with a secretKeyRef to another session's Secret", pod(func(p *corev1.Pod, ws, _ *corev1.Container) {
			initContainer(p, ws, func(c *corev1.Container) { c.Env = []corev1.EnvVar{secretEnv(otherCloudInit, "userdata")} })
		}), refusedPodSecrets},
		{"an init container other than guardian reading guardian's token", pod(func(p *corev1.Pod, ws, _ *corev1.Container) {
			initContainer(p, ws, func(c *corev1.Container) {
				c.Name = "guardian-2"
				c.Env = []corev1.EnvVar{secretEnv(ownCloudInit, kube.CleanupTokenKey)}
			})
		}), refusedPodSecrets},
		{"an init container with an envFrom secretRef of the database Secret", pod(func(p *corev1.Pod, ws, _ *corev1.Container) {
			initContainer(p, ws, func(c *corev1.Container) {
				c.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "labkeep-secrets"}}}}
			})
		}), refusedPodSecrets},
		{"a Job's Pod mounting a session's cloud-init Secret", job(func(spec *corev1.PodSpec) {
			spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "extra", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: ownCloudInit}}})
		}), refusedJob},
		{"a Job's Pod with a secretKeyRef", job(func(spec *corev1.PodSpec) {
			spec.Containers[0].Env = append(spec.Containers[0].Env, secretEnv(otherCloudInit, "userdata"))
		}), refusedJob},
		{"an image pull Secret", pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: otherCloudInit}}
		}), refusedPullSecret},
		{"labkeep's own Pod not named for its node", pod(func(p *corev1.Pod, _, _ *corev1.Container) {
			p.Name = "crafted"
		}), refusedPodName},
	})
	// The name is what ties a Pod's labels to one session: passing the
	// policy with another session's Secret (and so its cleanup token)
	// takes that session's Pod's name, and the API server refuses it as
	// taken.
	testAdmission(t, fnDyn, place.Sessions, []admissionCase{
		{"another session's labels, name, cloud-init Secret and cleanup token", pod(func(p *corev1.Pod, _, g *corev1.Container) {
			p.Labels = maps.Clone(workspace.Labels)
			p.Labels[kube.LabelSession] = other.ID
			p.Name = session.NodeName(other.ID, node)
			for i := range p.Spec.Volumes {
				if s := p.Spec.Volumes[i].Secret; s != nil {
					s.SecretName = otherCloudInit
				}
			}
			cleanupTokenFrom(t, g, otherCloudInit, kube.CleanupTokenKey)
		}), nameTaken},
	})

	t.Run("a VM's kernel boot image", func(t *testing.T) {
		testKernelBootImage(t, plain, fnDyn, place.Sessions)
	})
}

// testKernelBootImage: a copy of labkeep's own VM booting its kernel from
// a container image is refused when the image is outside the allowlist
// or comes with a pull Secret, and admitted when it is in it (the real
// VM deleted first, so the copy can take its name); so is a containerDisk
// with a pull Secret.
func testKernelBootImage(t *testing.T, cluster *kube.Cluster, fnDyn dynamic.Interface, ns string) {
	vmLab, ok := sampleLabs(t).Get("linux-vm")
	if !ok {
		t.Fatal("infra/base/labs.yaml has no linux-vm lab")
	}
	s := provisionOwn(t, cluster, studentSession(vmLab), vmLab)
	vm := stored(t, vmGVR, ns, session.NodeName(s.ID, vmLab.Nodes[0].Name))
	removeOwn(t, vmGVR, ns, vm.GetName())
	// ownVM makes copies of labkeep's own VM.
	ownVM := vmCopies(vm, vm.GetName())
	// kernelBoot is a copy of the VM booting a kernel from container.
	kernelBoot := func(container map[string]any) crafted {
		return ownVM(func(u *unstructured.Unstructured) {
			container["kernelPath"] = "/boot/vmlinuz"
			if err := unstructured.SetNestedMap(u.Object, map[string]any{"kernelArgs": "console=ttyS0", "container": container},
				"spec", "template", "spec", "domain", "firmware", "kernelBoot"); err != nil {
				t.Fatal(err)
			}
		})
	}
	pullSecret := session.CloudInitName(s.ID, vmLab.Nodes[0].Name)
	testAdmission(t, fnDyn, ns, []admissionCase{
		{"an image outside the allowlist", kernelBoot(map[string]any{"image": "docker.io/evil/kernel:1"}), refusedImage},
		{"a lookalike of an allowed prefix", kernelBoot(map[string]any{"image": "quay.io/containerdisks-evil/kernel:1"}), refusedImage},
		{"labkeep's own VM", ownVM(nil), ""},
		{"an image of the allowlist", kernelBoot(map[string]any{"image": "quay.io/containerdisks/fedora:40"}), ""},
		{"an image of the allowlist with a pull Secret", kernelBoot(map[string]any{
			"image": "quay.io/containerdisks/fedora:40", "imagePullSecret": pullSecret}), refusedPullSecret},
		{"a containerDisk with a pull Secret", ownVM(func(u *unstructured.Unstructured) {
			vols, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "volumes")
			for _, v := range vols {
				if cd, ok := v.(map[string]any)["containerDisk"].(map[string]any); ok {
					cd["imagePullSecret"] = pullSecret
				}
			}
			_ = unstructured.SetNestedSlice(u.Object, vols, "spec", "template", "spec", "volumes")
		}), refusedPullSecret},
	})
}

// cleanupTokenFrom points g's GUARDIAN_CLEANUP_TOKEN at key of Secret
// secret; labkeep's own Pod has the variable.
func cleanupTokenFrom(t *testing.T, g *corev1.Container, secret, key string) {
	t.Helper()
	for i := range g.Env {
		if g.Env[i].Name == "GUARDIAN_CLEANUP_TOKEN" {
			g.Env[i].ValueFrom = &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key}}
			return
		}
	}
	t.Fatalf("labkeep's guardian has no GUARDIAN_CLEANUP_TOKEN: %+v", g.Env)
}
