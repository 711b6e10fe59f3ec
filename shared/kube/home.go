package kube

import (
	"bytes"
	"context"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/remotecommand"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"labkeep/shared/labs"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// A student's home (labs.Home) is a PersistentVolumeClaim of its own,
// outside every session: it has no session label and no owner, so neither
// the garbage collector nor a session's teardown nor the reaper's orphan
// sweep ever deletes it with a session. It carries LabelEnv and
// LabelStudent like every labkeep object, RoleHome, and LabelHome with
// its group ("" for the student's default home).
const (
	LabelHome = "labkeep.io/home"
	RoleHome  = "home"
	// homeVolume names the home in a workspace Pod and in a VM.
	homeVolume = "home"
	// HomeDiskSerial is the home disk's serial in a VM: the guest finds it
	// at /dev/disk/by-id/virtio-<serial> whatever the bus order.
	HomeDiskSerial = "labkeep-home"
)

// HomeName is the name of student's home claim for group in env:
// home-<env>-<StudentHash>[-<group>]. It holds no personal data, and it
// is what the admission policy can compute from a Pod's or a VM's own
// labels (CEL has no hash), so a session mounts its own student's homes
// and no one else's.
func HomeName(env, student, group string) string {
	name := "home-" + env + "-" + StudentHash(student)
	if group != "" {
		name += "-" + group
	}
	return name
}

// homeName is the name of the session's student's home for the lab.
func (b builder) homeName() string { return HomeName(b.cfg.Env, b.sess.Student, b.lab.HomeGroup()) }

// homeClaim is the student's home claim for the lab's home: ReadWriteOnce
// (one session holds it at a time; a student has one live session), of
// the lab's size, on HomeStorageClass.
func (b builder) homeClaim() *corev1.PersistentVolumeClaim {
	h := b.lab.Home
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:      b.homeName(),
			Namespace: b.cfg.Namespace,
			Labels: map[string]string{
				LabelEnv:                       b.cfg.Env,
				LabelStudent:                   StudentHash(b.sess.Student),
				LabelRole:                      RoleHome,
				LabelHome:                      b.lab.HomeGroup(),
				"app.kubernetes.io/managed-by": "labkeep",
			},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(h.Size)}},
		},
	}
	if b.cfg.HomeStorageClass != "" {
		pvc.Spec.StorageClassName = ptr(b.cfg.HomeStorageClass)
	}
	return pvc
}

// homeMount gives the workspace container (only it: guardian never sees a
// student's files) the student's home at the lab's mount path.
func (b builder) homeMount(pod *corev1.Pod) {
	h := b.lab.Home
	if h == nil {
		return
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: homeVolume, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: b.homeName()}}})
	w := &pod.Spec.Containers[0]
	w.VolumeMounts = append(w.VolumeMounts, corev1.VolumeMount{Name: homeVolume, MountPath: h.MountPath})
}

// homeDisk gives the VM of the lab's home node the student's home as a
// second disk; other nodes get none.
func (b builder) homeDisk(n labs.Node, spec *kubevirtv1.VirtualMachineInstanceSpec) {
	h := b.lab.Home
	if h == nil || h.Node != n.Name {
		return
	}
	spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, kubevirtv1.Disk{Name: homeVolume, Serial: HomeDiskSerial,
		DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}})
	spec.Volumes = append(spec.Volumes, kubevirtv1.Volume{Name: homeVolume, VolumeSource: kubevirtv1.VolumeSource{
		PersistentVolumeClaim: &kubevirtv1.PersistentVolumeClaimVolumeSource{PersistentVolumeClaimVolumeSource: corev1.PersistentVolumeClaimVolumeSource{
			ClaimName: b.homeName()}}}})
}

// homeCloudConfig is the cloud-config that formats the home disk on its
// first use (ext4, labelled) and mounts it at the lab's mount path at
// every boot; "" for a node without the home. Every session's guest is a
// new instance to cloud-init, so fs_setup runs at each: partition auto
// looks at the disk first and leaves one holding ext4 labelled
// labkeep-home (or any file system) as it is, where partition none would
// format the raw disk whatever it holds.
func (b builder) homeCloudConfig(n labs.Node) string {
	h := b.lab.Home
	if h == nil || h.Node != n.Name {
		return ""
	}
	dev := "/dev/disk/by-id/virtio-" + HomeDiskSerial
	return fmt.Sprintf("fs_setup:\n  - {label: %s, filesystem: ext4, device: %q, partition: auto, overwrite: false}\n"+
		"mounts:\n  - [%q, %q, ext4, \"defaults,nofail\", \"0\", \"2\"]\n", HomeDiskSerial, dev, "LABEL="+HomeDiskSerial, h.MountPath)
}

// HomeFor implements session.Homes: the student's home for the lab, when
// it exists (it is used as it is) or a new one of the lab's size keeps
// the student's homes in this environment within HomeTotal;
// session.ErrHomeQuota, saying by how much, when it would not;
// session.ErrHomeBusy while the home is being deleted (a session would
// wait for a claim that is going).
func (c *Cluster) HomeFor(ctx context.Context, student string, lab labs.Lab) (string, error) {
	if lab.Home == nil {
		return "", nil
	}
	b := builder{cfg: c.cfg, sess: session.Session{Student: student}, lab: lab}
	want := b.homeClaim()
	switch state, err := c.homeState(ctx, want.Name); {
	case err != nil:
		return "", err
	case state == homeDeleting:
		return "", fmt.Errorf("%w: your home %s is being deleted (an admin or the reaper removed it); open the lab again in a minute for a new, empty one", session.ErrHomeBusy, want.Name)
	case state == homePresent:
		return want.Name, nil
	}
	cctx, cancel := c.call(ctx)
	homes, err := c.kube.CoreV1().PersistentVolumeClaims(c.cfg.Namespace).List(cctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		LabelEnv: c.cfg.Env, LabelStudent: StudentHash(student), LabelRole: RoleHome}).String()})
	cancel()
	if err != nil {
		return "", fmt.Errorf("listing the student's homes: %w", err)
	}
	total := want.Spec.Resources.Requests[corev1.ResourceStorage]
	for _, h := range homes.Items {
		if h.DeletionTimestamp == nil { // one being deleted holds nothing for long
			total.Add(h.Spec.Resources.Requests[corev1.ResourceStorage])
		}
	}
	if total.Cmp(c.cfg.HomeTotal) > 0 {
		return "", fmt.Errorf("%w: lab %s keeps a home of %s, which would bring your homes to %s, over the %s a student may keep; ask an admin to delete a home you no longer need",
			session.ErrHomeQuota, lab.Name, lab.Home.Size, total.String(), c.cfg.HomeTotal.String())
	}
	return want.Name, nil
}

// homeState is whether a home claim exists.
type homeState int

const (
	homeAbsent homeState = iota
	homePresent
	homeDeleting // it exists with a deletion timestamp
)

// homeState reads whether the home claim name exists.
func (c *Cluster) homeState(ctx context.Context, name string) (homeState, error) {
	cctx, cancel := c.call(ctx)
	defer cancel()
	pvc, err := c.kube.CoreV1().PersistentVolumeClaims(c.cfg.Namespace).Get(cctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return homeAbsent, nil
	case err != nil:
		return homeAbsent, fmt.Errorf("reading the student's home %s: %w", name, err)
	case pvc.DeletionTimestamp != nil:
		return homeDeleting, nil
	}
	return homePresent, nil
}

// ListHomes implements reap.Cluster: this environment's homes, one list
// call.
func (c *Cluster) ListHomes(ctx context.Context) ([]reap.HomeClaim, error) {
	list, err := listWith(ctx, c, c.kube.CoreV1().PersistentVolumeClaims(c.cfg.Namespace).List, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		LabelEnv: c.cfg.Env, LabelRole: RoleHome}).String()})
	if err != nil {
		return nil, fmt.Errorf("listing homes: %w", err)
	}
	var homes []reap.HomeClaim
	for _, h := range list.Items {
		if !isHome(h.ObjectMeta, c.cfg.Env) {
			continue
		}
		size := h.Spec.Resources.Requests[corev1.ResourceStorage]
		homes = append(homes, reap.HomeClaim{Name: h.Name, UID: string(h.UID), Env: h.Labels[LabelEnv], Group: h.Labels[LabelHome],
			Size: size.String(), CreatedAt: h.CreationTimestamp.Time, Deleting: h.DeletionTimestamp != nil})
	}
	return homes, nil
}

// isHome reports whether m is a home of env: labelled so, with no
// session.
func isHome(m metav1.ObjectMeta, env string) bool {
	_, grouped := m.Labels[LabelHome]
	return m.Labels[LabelEnv] == env && m.Labels[LabelRole] == RoleHome && grouped && m.Labels[LabelSession] == ""
}

// DeleteHome implements reap.Cluster: it deletes the home h, read again
// first: gone, or another claim of that name (another UID), counts as
// deleted; one that is not a home of this environment is refused with
// session.ErrNotOurs.
func (c *Cluster) DeleteHome(ctx context.Context, h reap.HomeClaim) error {
	pvcs := c.kube.CoreV1().PersistentVolumeClaims(c.cfg.Namespace)
	cctx, cancel := c.call(ctx)
	cur, err := pvcs.Get(cctx, h.Name, metav1.GetOptions{})
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("deleting home %s: reading it: %w", h.Name, err)
	case h.UID != "" && string(cur.UID) != h.UID:
		return nil
	case !isHome(cur.ObjectMeta, c.cfg.Env):
		return fmt.Errorf("%w: claim %s is not a home of environment %q", session.ErrNotOurs, h.Name, c.cfg.Env)
	}
	cctx, cancel = c.call(ctx)
	defer cancel()
	uid := cur.UID
	if err := pvcs.Delete(cctx, h.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting home %s: %w", h.Name, err)
	}
	return nil
}

// ensureHome makes the student's home for the lab unless it exists. The
// open asked HomeFor before it wrote the session's row; a home deleted
// since (the reaper's delete racing this open) fails the open rather than
// leave its Pod waiting for a claim that is going.
func (c *Cluster) ensureHome(ctx context.Context, b builder) error {
	want := b.homeClaim()
	switch state, err := c.homeState(ctx, want.Name); {
	case err != nil:
		return err
	case state == homeDeleting:
		return fmt.Errorf("the student's home %s is being deleted; open the lab again for a new one", want.Name)
	case state == homePresent:
		return nil
	}
	if _, err := create(ctx, c, "the student's home", want, c.kube.CoreV1().PersistentVolumeClaims(c.cfg.Namespace).Create); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// ArchiveHome writes the home s holds as a gzipped tar stream to w: tar
// runs in s's workspace container (a pod lab's running session), over the
// home's mount there, through the API server's pods/exec, so the archive
// is streamed and never stored. ErrNotRunning when s has no running
// workspace with a home.
func (c *Cluster) ArchiveHome(ctx context.Context, s session.Session, w io.Writer) error {
	if err := c.canExec(); err != nil {
		return err
	}
	if s.Kind != labs.KindPod || s.Status != session.StatusRunning || s.Home == "" || len(s.Nodes) != 1 {
		return fmt.Errorf("%w: a home is downloaded while a running pod lab session holds it", session.ErrNotRunning)
	}
	name := session.NodeName(s.ID, s.Nodes[0].Name)
	cctx, cancel := c.call(ctx)
	pod, err := c.kube.CoreV1().Pods(c.cfg.Namespace).Get(cctx, name, metav1.GetOptions{})
	cancel()
	if err != nil {
		return fmt.Errorf("reading workspace Pod %s: %w", name, err)
	}
	var dir string
	for _, ctr := range pod.Spec.Containers {
		for _, m := range ctr.VolumeMounts {
			if ctr.Name == labs.WorkspaceContainer && m.Name == homeVolume {
				dir = m.MountPath
			}
		}
	}
	if dir == "" {
		return fmt.Errorf("%w: workspace Pod %s mounts no home", session.ErrNotRunning, name)
	}
	return c.streamTar(ctx, name, labs.WorkspaceContainer, dir, s.Home, w)
}

// streamTar runs tar over dir in container of Pod pod, through the API
// server's pods/exec, and copies its gzipped output to w as it comes.
func (c *Cluster) streamTar(ctx context.Context, pod, container, dir, home string, w io.Writer) error {
	ex, err := containerExecutor(c.rc, c.kube, c.cfg.Namespace, pod, container, corev1.PodExecOptions{
		Command: []string{"tar", "-C", dir, "-czf", "-", "."}, Stdout: true, Stderr: true})
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: w, Stderr: &stderr}); err != nil {
		return fmt.Errorf("archiving home %s: %w: %s", home, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}
