package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v11/controller"

	"labkeep/localrun/controlplane"
)

// StorageClassName is the node's StorageClass, the cluster's default: a
// claim of it gets a volume of its own on this node (volumes), made once
// the scheduler has placed the claim's first Pod here
// (WaitForFirstConsumer) and deleted with the claim.
const StorageClassName = "labkeep-local"

// volumeProvisioner names the node's provisioner in its StorageClass.
const volumeProvisioner = "labkeep.io/local-volume"

// volumesAccount is the identity the provisioner runs as.
const volumesAccount = "labkeep-volumes"

// volumes provisions the node's volumes (sig-storage-lib-external-
// provisioner's controller does the Kubernetes part): each an ext4 file
// system in a sparse file of the claim's size under the node's Dir,
// loop-mounted in the node's mount namespace, where the kubelet and
// containerd resolve paths, and offered as a local PersistentVolume bound
// to this node. The size is real: a full volume refuses writes (ENOSPC)
// and the host's disk keeps its room. Its mounts go with the node's mount
// namespace when the node stops, the files with its Dir.
type volumes struct {
	n *Node
}

var (
	_ controller.Provisioner = volumes{}
	_ controller.Qualifier   = volumes{}
)

// ShouldProvision takes only claims the scheduler placed on this node:
// another node of the cluster (the cgroup v2 guest) has no provisioner.
func (v volumes) ShouldProvision(_ context.Context, pvc *corev1.PersistentVolumeClaim) bool {
	return pvc.Annotations["volume.kubernetes.io/selected-node"] == v.n.Name
}

// Provision makes the volume of opts.PVC: its file, file system and mount.
func (v volumes) Provision(ctx context.Context, opts controller.ProvisionOptions) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	if opts.SelectedNode == nil || opts.SelectedNode.Name != v.n.Name {
		return nil, controller.ProvisioningFinished, fmt.Errorf("volumes are made on node %s only", v.n.Name)
	}
	size := opts.PVC.Spec.Resources.Requests[corev1.ResourceStorage]
	if size.Sign() <= 0 {
		return nil, controller.ProvisioningFinished, errors.New("the claim asks for no storage")
	}
	if mode := opts.PVC.Spec.VolumeMode; mode != nil && *mode != corev1.PersistentVolumeFilesystem {
		return nil, controller.ProvisioningFinished, errors.New("only file system volumes are made here")
	}
	dir, img := v.paths(opts.PVName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	// A retry finds a file system already made: mkfs only on a new file.
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		if err := run(ctx, "truncate", "-s", fmt.Sprint(size.Value()), img+".new"); err != nil {
			return nil, controller.ProvisioningFinished, err
		}
		if err := run(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "root_owner=0:0", img+".new"); err != nil {
			return nil, controller.ProvisioningFinished, err
		}
		if err := os.Rename(img+".new", img); err != nil {
			return nil, controller.ProvisioningFinished, err
		}
	}
	if err := v.inNode(ctx, "mountpoint -q %[1]s || mount -o loop %[2]s %[1]s", dir, img); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: opts.PVName},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: *opts.StorageClass.ReclaimPolicy,
			AccessModes:                   opts.PVC.Spec.AccessModes,
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(size.Value(), resource.BinarySI)},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{v.n.Name}}},
			}}}},
		},
	}, controller.ProvisioningFinished, nil
}

// Delete unmounts the volume of pv and removes its file and directory.
func (v volumes) Delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	dir, img := v.paths(pv.Name)
	if err := v.inNode(ctx, "! mountpoint -q %[1]s || umount %[1]s", dir); err != nil {
		return err
	}
	return errors.Join(os.Remove(img), os.Remove(dir))
}

// paths are the mount point and the file of volume name.
func (v volumes) paths(name string) (dir, img string) {
	return v.n.path("volumes", name), v.n.path("volumes", name+".img")
}

// inNode runs the shell command format (its arguments quoted) in the
// node's mount namespace.
func (v volumes) inNode(ctx context.Context, format string, args ...any) error {
	quoted := make([]any, len(args))
	for i, a := range args {
		quoted[i] = "'" + strings.ReplaceAll(fmt.Sprint(a), "'", `'\''`) + "'"
	}
	return run(ctx, "nsenter", "--mount="+nsPath(v.n.netPid, "mnt"), "--", "sh", "-c", fmt.Sprintf(format, quoted...))
}

// run runs a command, its output in the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startVolumes makes StorageClassName the cluster's default class and
// runs its provisioner (volumes) as kube-system/labkeep-volumes until the
// node stops.
func (n *Node) startVolumes(ctx context.Context, cp *controlplane.ControlPlane, cs kubernetes.Interface) error {
	if err := grant(ctx, cs, volumesAccount, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"persistentvolumes"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "update", "patch"}},
		{APIGroups: []string{storagev1.GroupName}, Resources: []string{"storageclasses"}, Verbs: []string{"get", "list", "watch"}},
	}); err != nil {
		return err
	}
	wait := storagev1.VolumeBindingWaitForFirstConsumer
	del := corev1.PersistentVolumeReclaimDelete
	class := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: StorageClassName, Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner:       volumeProvisioner,
		ReclaimPolicy:     &del,
		VolumeBindingMode: &wait,
	}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	rc, err := cp.ServiceAccountConfig(ctx, "kube-system", volumesAccount)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(n.path("volumes"), 0o755); err != nil {
		return err
	}
	// Its log goes to a file of the node's, as its other components' do:
	// klog's default writes to the process's stderr, which the test
	// framework replaces while it runs (a data race under -race).
	logFile, err := os.OpenFile(n.path("volumes.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), logr.FromSlogHandler(slog.NewTextHandler(logFile, nil))))
	n.stopVolumes = func() {
		cancel()
		logFile.Close()
	}
	pc := controller.NewProvisionController(runCtx, client, volumeProvisioner, volumes{n: n},
		controller.LeaderElection(false), controller.MetricsPort(0))
	go pc.Run(runCtx)
	return nil
}
