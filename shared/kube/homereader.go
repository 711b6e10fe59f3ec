package kube

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"labkeep/shared/access"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// A home reader is a short-lived Pod that mounts one student's home
// read-only so that the home can be downloaded while no session holds it:
// tar runs in it through pods/exec, as in a running workspace, and the
// archive is streamed, never stored. It belongs to no session: it carries
// LabelEnv, LabelStudent, LabelHome and RoleHomeReader, no LabelSession,
// no owner and no deadline (a Pod with activeDeadlineSeconds counts as a
// workspace: CountWorkspacePods, the labkeep-workspaces quota). Its one
// container sleeps reap.HomeReaderLifetime and ends. The function that
// made it deletes it when the download ends; the reaper deletes one left
// behind (reap.HomeReader). There is one reader per home at a time (its
// name is the home's), so a student cannot pile readers up.
const (
	RoleHomeReader = "home-reader"
	// ReaderContainer is the reader's container: besides a workspace's
	// own, the only container the functions may exec into.
	ReaderContainer = "reader"
	// readerMountPath is where the reader mounts the home.
	readerMountPath = "/home-archive"
)

// HomeReaderName is the name of home's reader Pod.
func HomeReaderName(home string) string { return "reader-" + home }

// isHomeReader reports whether an object labelled l is a home reader of
// env.
func isHomeReader(l map[string]string, env string) bool {
	return l[LabelEnv] == env && l[LabelRole] == RoleHomeReader && l[LabelSession] == ""
}

// homeReader is the reader Pod of home. It runs as the image's user (root
// in labkeep's images) with DAC_OVERRIDE alone, so it reads every file
// the student left, whatever its owner and mode, and writes none: the
// claim and its mount are read-only and so is its root file system.
func (c *Cluster) homeReader(home *corev1.PersistentVolumeClaim) *corev1.Pod {
	limits := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      HomeReaderName(home.Name),
			Namespace: c.cfg.Namespace,
			Labels: map[string]string{
				LabelEnv:                       c.cfg.Env,
				LabelStudent:                   home.Labels[LabelStudent],
				LabelRole:                      RoleHomeReader,
				LabelHome:                      home.Labels[LabelHome],
				"app.kubernetes.io/managed-by": "labkeep",
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr(false),
			EnableServiceLinks:            ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(0)),
			Containers: []corev1.Container{{
				Name:         ReaderContainer,
				Image:        c.cfg.HomeReaderImage,
				Command:      []string{"sleep", strconv.Itoa(int(reap.HomeReaderLifetime / time.Second))},
				VolumeMounts: []corev1.VolumeMount{{Name: homeVolume, MountPath: readerMountPath, ReadOnly: true}},
				Resources: corev1.ResourceRequirements{Limits: limits, Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi")}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr(false),
					ReadOnlyRootFilesystem:   ptr(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"DAC_OVERRIDE"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
			}},
			Volumes: []corev1.Volume{{Name: homeVolume, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: home.Name, ReadOnly: true}}}},
		},
	}
}

// ArchiveIdleHome writes student's home name, which no session holds, as a
// gzipped tar stream to w: it makes the home's reader, waits for it to run
// (at most reap.HomeReaderStart), runs tar in it and deletes it. A claim
// that is not a home of this environment and student is
// session.ErrNotOurs; a home gone or being deleted, or whose reader exists
// already (another download of it is under way, or one was cut off and its
// reader has not ended yet), session.ErrHomeBusy saying when that reader
// ends at the latest; a reader that does not start, access.ErrBadGateway
// saying what it waits for.
//
// The reader is deleted when the download ends, however it ends; one a
// killed function leaves ends by itself within reap.HomeReaderLifetime and
// the reaper deletes it. The caller checks that no session holds the home;
// a session that opens while the download runs mounts the home beside the
// reader (both on the node the home's volume is on; a volume that attaches
// to one node at a time keeps the session's Pod waiting until the reader
// is gone).
func (c *Cluster) ArchiveIdleHome(ctx context.Context, student, name string, w io.Writer) error {
	if err := c.canExec(); err != nil {
		return err
	}
	cctx, cancel := c.call(ctx)
	home, err := c.kube.CoreV1().PersistentVolumeClaims(c.cfg.Namespace).Get(cctx, name, metav1.GetOptions{})
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: home %s was deleted just now", session.ErrHomeBusy, name)
	case err != nil:
		return fmt.Errorf("reading home %s: %w", name, err)
	case !isHome(home.ObjectMeta, c.cfg.Env) || home.Labels[LabelStudent] != StudentHash(student):
		return fmt.Errorf("%w: claim %s is not a home of this student in environment %q", session.ErrNotOurs, name, c.cfg.Env)
	case home.DeletionTimestamp != nil:
		return fmt.Errorf("%w: home %s is being deleted", session.ErrHomeBusy, name)
	}
	pods := c.kube.CoreV1().Pods(c.cfg.Namespace)
	want := c.homeReader(home)
	asked := time.Now().Add(-time.Second).Truncate(time.Second) // creation times are whole seconds
	reader, err := create(ctx, c, "the home's reader", want, pods.Create)
	switch {
	case apierrors.IsAlreadyExists(err):
		return c.readerBusy(ctx, want.Name, name)
	case err != nil && !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
		// The create may have been stored though its answer was lost
		// (a timeout, a cancelled request): delete what this call made.
		c.deleteReader(ctx, want.Name, "", asked)
		return err
	case err != nil:
		return err
	}
	defer c.deleteReader(ctx, reader.Name, reader.UID, time.Time{})
	if err := c.awaitRunning(ctx, reader.Name, reap.HomeReaderStart); err != nil {
		return fmt.Errorf("%w: the reader of home %s: %w", access.ErrBadGateway, name, err)
	}
	return c.streamTar(ctx, reader.Name, ReaderContainer, readerMountPath, name, w)
}

// readerBusy is the refusal of a download whose home's reader exists
// already, saying when that reader ends at the latest.
func (c *Cluster) readerBusy(ctx context.Context, reader, home string) error {
	busy := fmt.Errorf("%w: another download of home %s is under way", session.ErrHomeBusy, home)
	cctx, cancel := c.call(ctx)
	defer cancel()
	if p, err := c.kube.CoreV1().Pods(c.cfg.Namespace).Get(cctx, reader, metav1.GetOptions{}); err == nil {
		end := p.CreationTimestamp.Add(reap.HomeReaderStart + reap.HomeReaderLifetime).UTC()
		busy = fmt.Errorf("%w: another download of home %s is under way, or was cut off; try again when it has ended, by %s at the latest",
			session.ErrHomeBusy, home, end.Format(time.RFC3339))
	}
	return busy
}

// deleteReader deletes reader Pod name on a context of its own (the
// reader goes even when the request was cancelled): the one of uid, or,
// without one, the one there if it was made at made or later (a create
// whose answer was lost). A reader this cannot delete ends by itself and
// is the reaper's (reap.Plan).
func (c *Cluster) deleteReader(ctx context.Context, name string, uid types.UID, made time.Time) {
	dctx, cancel := c.call(context.WithoutCancel(ctx))
	defer cancel()
	pods := c.kube.CoreV1().Pods(c.cfg.Namespace)
	if uid == "" {
		p, err := pods.Get(dctx, name, metav1.GetOptions{})
		if err != nil || p.CreationTimestamp.Time.Before(made) || !isHomeReader(p.Labels, c.cfg.Env) {
			return
		}
		uid = p.UID
	}
	_ = pods.Delete(dctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0)), Preconditions: &metav1.Preconditions{UID: &uid}})
}

// awaitRunning polls Pod name until it runs, for at most limit. An ended
// or deleted Pod, one whose image cannot be pulled or whose container
// cannot be made, and one still waiting at the limit are errors saying
// what it waits for.
func (c *Cluster) awaitRunning(ctx context.Context, name string, limit time.Duration) error {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	waiting := "to be scheduled"
	for {
		cctx, ccancel := c.call(ctx)
		pod, err := c.kube.CoreV1().Pods(c.cfg.Namespace).Get(cctx, name, metav1.GetOptions{})
		ccancel()
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("Pod %s was deleted before it started", name)
		case err == nil && pod.Status.Phase == corev1.PodRunning:
			return nil
		case err == nil && (pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed):
			return fmt.Errorf("Pod %s %s", name, PodDown(pod))
		case err == nil:
			if why, stuck := podWaiting(pod); stuck {
				return fmt.Errorf("Pod %s cannot start: %s", name, why)
			} else {
				waiting = why
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for Pod %s to start (it was waiting %s): %w", name, waiting, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("Pod %s did not start within %s (waiting %s)", name, limit, waiting)
		case <-tick.C:
		}
	}
}

// hopeless are the reasons a container waits that no wait mends: its
// image cannot be pulled or named, or the container cannot be made.
var hopeless = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true,
	"ErrImageNeverPull": true, "CreateContainerConfigError": true, "CreateContainerError": true}

// podWaiting says what a Pod that is not running waits for, in the words
// the cluster reports, and whether that is hopeless.
func podWaiting(pod *corev1.Pod) (string, bool) {
	for _, s := range pod.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil && w.Reason != "" {
			return strings.TrimSpace("for its container: " + w.Reason + " " + w.Message), hopeless[w.Reason]
		}
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Status != corev1.ConditionTrue && cond.Message != "" {
			return "for " + string(cond.Type) + ": " + cond.Message, false
		}
	}
	if pod.Spec.NodeName == "" {
		return "to be scheduled", false
	}
	return "to start on node " + pod.Spec.NodeName, false
}
