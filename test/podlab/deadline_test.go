package podlab_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// stopFunctions stops everything of labkeep in d: no function is served,
// no reaper runs, the database pool is closed. The stack (control plane,
// node, the database server other tests share) keeps running.
func stopFunctions(d *stacktest.Deployment) {
	d.Server.Close()
	d.App.Close()
}

// cordon makes the node unschedulable (or schedulable again) as `kubectl
// cordon` does; the test always leaves it schedulable.
func cordon(t *testing.T, cs *stacktest.Deployment, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	if _, err := cs.Kube.CoreV1().Nodes().Patch(context.Background(), st.Node.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if on {
		t.Cleanup(func() { cordon(t, cs, false) })
	}
}

// With every labkeep process gone, the session's anchor alone ends its
// running workspace Pod at max lifetime + grace: the Job's deadline fails
// it, the TTL controller deletes it and the garbage collector the Pod it
// owns, and the kubelet stops its containers. The Pod is held back from the
// node for a while after the anchor starts (node cordoned), so the Pod's
// own activeDeadlineSeconds, counted from its own start, would fire only
// later: what ends it here is the anchor.
func TestAnchorEndsTheRealPod(t *testing.T) {
	const lifetime, maxLifetime, grace = 40 * time.Second, 40 * time.Second, 20 * time.Second
	d := stacktest.Deploy(t, st, stacktest.Options{Lifetime: lifetime, MaxLifetime: maxLifetime, DeadlineGrace: grace})
	ctx := context.Background()
	cordon(t, d, true)
	s := openLab(t, d, "frank", "shell", nil)
	job, err := d.Kube.BatchV1().Jobs(d.Namespace).Get(ctx, session.AnchorName(s.opened.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		job, err = d.Kube.BatchV1().Jobs(d.Namespace).Get(ctx, job.Name, metav1.GetOptions{})
		return err == nil && job.Status.StartTime != nil, fmt.Sprintf("anchor not started: %v", err)
	})
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		return time.Since(job.Status.StartTime.Time) > 15*time.Second, "holding the workspace Pod back"
	})
	cordon(t, d, false)
	s.waitRunning(time.Minute)
	s.waitSSH(time.Minute)
	pod := s.pod()
	anchorDeadline := job.Status.StartTime.Add(time.Duration(*job.Spec.ActiveDeadlineSeconds) * time.Second)
	ownDeadline := pod.Status.StartTime.Add(time.Duration(*pod.Spec.ActiveDeadlineSeconds) * time.Second)
	if want := int64((maxLifetime + grace) / time.Second); *job.Spec.ActiveDeadlineSeconds != want {
		t.Fatalf("anchor deadline %ds, want max lifetime + grace = %ds", *job.Spec.ActiveDeadlineSeconds, want)
	}
	if !ownDeadline.After(anchorDeadline.Add(10 * time.Second)) {
		t.Fatalf("the Pod's own deadline %s is not well after the anchor's %s", ownDeadline, anchorDeadline)
	}
	uid := string(pod.UID)
	stopFunctions(d)

	// The Pod is deleted (not failed by its own deadline), then gone, and
	// its containers with it.
	var deletedAt time.Time
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		p := s.pod()
		if p == nil {
			return true, ""
		}
		if p.DeletionTimestamp != nil && deletedAt.IsZero() {
			deletedAt = time.Now()
			if p.Status.Phase != corev1.PodRunning {
				t.Errorf("the Pod was %s (%s) when deleted: its own deadline ended it, not the anchor", p.Status.Phase, p.Status.Reason)
			}
		}
		return false, fmt.Sprintf("workspace Pod still there (%s, deleting %v)", s.podState(), p.DeletionTimestamp != nil)
	})
	gone := time.Now()
	if deletedAt.IsZero() || deletedAt.After(ownDeadline) {
		t.Errorf("the Pod's deletion was seen at %s, its own deadline is %s", deletedAt, ownDeadline)
	}
	if deletedAt.Before(anchorDeadline) {
		t.Errorf("the Pod was deleted at %s, before the anchor's deadline %s", deletedAt, anchorDeadline)
	}
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		left := runtimeContainers(t, uid)
		return len(left) == 0, fmt.Sprintf("containers of the Pod left on the node: %v", left)
	})
	if _, err := d.Kube.BatchV1().Jobs(d.Namespace).Get(ctx, job.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("anchor Job: %v, want it gone", err)
	}
	if got := d.RowStatus(s.opened.ID); got != session.StatusRunning {
		t.Errorf("the row is %s: something of labkeep ran", got)
	}
	t.Logf("anchor deadline (max lifetime %s + grace %s) → Pod deletion seen +%s, Pod gone +%s, containers gone +%s; the Pod's own deadline was %s later",
		maxLifetime, grace, deletedAt.Sub(anchorDeadline).Round(100*time.Millisecond), gone.Sub(anchorDeadline).Round(100*time.Millisecond),
		time.Since(anchorDeadline).Round(100*time.Millisecond), ownDeadline.Sub(anchorDeadline).Round(time.Second))
}

// The workspace Pod carries the anchor's deadline as its own
// activeDeadlineSeconds, and the kubelet enforces it on the running Pod
// with nothing of labkeep running: the Pod fails with DeadlineExceeded and
// its containers stop. Kubernetes lets a Pod's deadline only be lowered;
// lowering it on the real Pod labkeep built (the anchor's stays hours away)
// shows the Pod's own deadline at work without waiting for the anchor's.
func TestPodsOwnDeadlineEndsIt(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{})
	ctx := context.Background()
	s := openLab(t, d, "grace", "shell", nil)
	s.waitRunning(3 * time.Minute)
	pod := s.pod()
	job, err := d.Kube.BatchV1().Jobs(d.Namespace).Get(ctx, session.AnchorName(s.opened.ID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.ActiveDeadlineSeconds == nil || *pod.Spec.ActiveDeadlineSeconds != *job.Spec.ActiveDeadlineSeconds {
		t.Fatalf("the Pod's activeDeadlineSeconds %v, want the anchor's %d", pod.Spec.ActiveDeadlineSeconds, *job.Spec.ActiveDeadlineSeconds)
	}
	stopFunctions(d)
	ads := int64(time.Since(pod.Status.StartTime.Time)/time.Second) + 15
	patch := fmt.Sprintf(`{"spec":{"activeDeadlineSeconds":%d}}`, ads)
	if _, err := d.Kube.CoreV1().Pods(d.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := pod.Status.StartTime.Add(time.Duration(ads) * time.Second)
	s.waitSSH(time.Minute) // still up before its deadline
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		p := s.pod()
		if p == nil {
			t.Fatal("the workspace Pod was deleted")
		}
		stopped := p.Status.Phase == corev1.PodFailed
		for _, name := range []string{"guardian", "workspace"} {
			stopped = stopped && status(p, name).State.Terminated != nil
		}
		return stopped && p.Status.Reason == "DeadlineExceeded", "Pod: " + s.podState() + " " + p.Status.Reason
	})
	failed := time.Since(deadline)
	if _, err := s.run("true", nil); err == nil {
		t.Error("the student still logs in after the Pod's deadline")
	}
	if got := d.RowStatus(s.opened.ID); got != session.StatusRunning {
		t.Errorf("the row is %s: something of labkeep ran", got)
	}
	t.Logf("the Pod's own deadline → Failed (DeadlineExceeded), guardian and workspace stopped, +%s", failed.Round(100*time.Millisecond))
}
