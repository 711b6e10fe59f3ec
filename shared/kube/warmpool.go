package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/shared/labs"
	"labkeep/shared/seating"
	"labkeep/shared/session"
)

// LabelPool, with the value PoolWarm, marks the objects made for a warm
// pool instance, claimed or not; objects of other sessions do not carry
// it. (Whether an instance is claimed is the row's to say.)
const (
	LabelPool = "labkeep.io/pool"
	PoolWarm  = "warm"
)

var _ seating.PoolCluster = (*Cluster)(nil)

// authorizedKeys are the keys a session's nodes authorize: the student's
// (none for an unclaimed pool instance) and the platform's.
func authorizedKeys(s session.Session, cfg Config) []string {
	var keys []string
	if s.StudentKey != "" {
		keys = append(keys, s.StudentKey)
	}
	return append(keys, cfg.PlatformSSHKeys...)
}

// WorkspaceKeysFile is where a workspace image's sshd reads the authorized
// keys (AuthorizedKeysFile): the entrypoint copies them there from the
// session's Secret at each container start, and a warm pool claim
// replaces them in the running container.
const WorkspaceKeysFile = "/run/sshd/authorized_keys"

// RootSSHDir is root's ~/.ssh in a workspace container; sshd reads its
// authorized_keys besides WorkspaceKeysFile (labkeep's workspace image,
// localrun/images). PoolKeysVolume is the emptyDir a pool instance's
// workspace Pod mounts there.
const (
	RootSSHDir     = "/root/.ssh"
	PoolKeysVolume = "root-ssh"
)

// keepClaimedKeys gives the workspace Pod of a pool instance a small
// memory-backed emptyDir at RootSSHDir. A claim writes the student's keys
// there too: an emptyDir outlives container restarts, so when the
// student kills sshd (the container restarts, and its entrypoint copies
// WorkspaceKeysFile from the Secret, which holds no student key) they can
// still log in. Other sessions' Pods are unchanged.
func (b builder) keepClaimedKeys(pod *corev1.Pod) {
	if b.sess.Pool == "" {
		return
	}
	size := resource.MustParse("1Mi")
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: PoolKeysVolume, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &size}}})
	w := &pod.Spec.Containers[0]
	w.VolumeMounts = append(w.VolumeMounts, corev1.VolumeMount{Name: PoolKeysVolume, MountPath: RootSSHDir})
}

// Claim implements seating.PoolCluster: the student's keys (with the
// platform's) are delivered to the running instance.
//
// The objects keep their labels: they already carry the session's id and
// environment (a claim keeps the instance's id, so its anchor, Secrets,
// NetworkPolicy and nodes are the session's as they are), and LabelPool.
// They never carry the student's hash: the functions may not patch or
// update any object (infra/base/rbac.yaml), and the row is the truth about who
// holds the session.
//
// A workspace Pod gets the keys written to WorkspaceKeysFile in its
// running workspace container through pods/exec (the web terminal's path,
// the workspace container only), atomically (a temporary file renamed
// over it). sshd reads that file at every login, so the student's next
// connection is let in, with no restart; the exec's exit status confirms
// the write before the claim commits. The keys also go to root's
// authorized_keys on the Pod's emptyDir (keepClaimedKeys), so they survive
// a restart of the workspace container. A Secret update would reach the Pod
// only at the kubelet's next sync (a minute or more), and the functions
// may not update Secrets.
//
// VMs of a pool instance are built with live keys (credentials.go): the
// claim replaces each node's keys Secret (ReplaceSSHKeys), and KubeVirt's
// guest agent writes root's authorized_keys from it once the kubelet has
// brought the new Secret into the virt-launcher Pod (typically within a
// minute or two; no API object confirms it). Until then the student's
// first SSH attempts are refused; the platform's keys work throughout.
func (c *Cluster) Claim(ctx context.Context, inst seating.Instance, studentKey string, lab labs.Lab) error {
	if studentKey == "" {
		return fmt.Errorf("claiming warm pool instance %s: no student key", inst.ID)
	}
	s := claimedSession(inst, studentKey)
	if lab.Kind == labs.KindVM {
		return c.ReplaceSSHKeys(ctx, s, lab, authorizedKeys(s, c.cfg))
	}
	keys := strings.Join(authorizedKeys(s, c.cfg), "\n") + "\n"
	// Both files are replaced by a rename; root's copy first, so the
	// answer never precedes a durable copy.
	tmp := WorkspaceKeysFile + ".claim"
	script := `umask 077 && cat >` + tmp + ` && mkdir -p ` + RootSSHDir + ` && cp ` + tmp + ` ` + RootSSHDir + `/authorized_keys.claim && mv -f ` +
		RootSSHDir + `/authorized_keys.claim ` + RootSSHDir + `/authorized_keys && mv -f ` + tmp + ` ` + WorkspaceKeysFile
	for _, n := range s.Nodes {
		var out execOutput
		if err := c.exec(ctx, session.NodeName(s.ID, n.Name), []string{"/bin/sh", "-c", script}, strings.NewReader(keys), &out); err != nil {
			return fmt.Errorf("delivering the student's key to %s: %w (%s)", n.Name, err, strings.TrimSpace(out.String()))
		}
	}
	return nil
}

// claimedSession is the session inst becomes with studentKey, as far as
// its objects are concerned: its id, nodes and the warm pool's labels
// (LabelPool, no student's hash) stay the instance's.
func claimedSession(inst seating.Instance, studentKey string) session.Session {
	return session.Session{ID: inst.ID, Lab: inst.Lab, Kind: inst.Kind, Status: session.StatusRunning, Window: inst.Window,
		Nodes: inst.Nodes, StudentKey: studentKey, Pool: session.PoolClaimed}
}

// execOutput is a command's stdout and stderr together, as they came. The
// executor copies the two streams from two goroutines, so writes are
// serialised.
type execOutput struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *execOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *execOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// exec runs command in the workspace container of Pod pod with stdin,
// through pods/exec (WorkspaceExecutor), and returns when it exited; a
// non-zero exit is an error.
func (c *Cluster) exec(ctx context.Context, pod string, command []string, stdin *strings.Reader, out *execOutput) error {
	if c.rc == nil {
		return errors.New("pods/exec needs the cluster's REST config (NewForConfig)")
	}
	ctx, cancel := c.call(ctx)
	defer cancel()
	ex, err := WorkspaceExecutor(c.rc, c.kube, c.cfg.Namespace, pod, corev1.PodExecOptions{Command: command, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: out, Stderr: out})
}
