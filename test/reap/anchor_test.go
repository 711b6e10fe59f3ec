package reap_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// anchorPod waits until the anchor Job of session id has exactly one live
// Pod other than the Pods in old, and returns it.
func (b *backend) anchorPod(id string, old ...types.UID) *corev1.Pod {
	b.t.Helper()
	var live []*corev1.Pod
	stacktest.Eventually(b.t, 60*time.Second, func() (bool, string) {
		list, err := b.Kube.CoreV1().Pods(b.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: kube.LabelAnchorOf + "=" + id})
		if err != nil {
			b.t.Fatal(err)
		}
		live = nil
		for i := range list.Items {
			p := &list.Items[i]
			if p.DeletionTimestamp == nil && !slices.Contains(old, p.UID) &&
				p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				live = append(live, p)
			}
		}
		if len(live) == 1 {
			return true, ""
		}
		job := "gone"
		if j, err := b.Kube.BatchV1().Jobs(b.Namespace).Get(context.Background(), session.AnchorName(id), metav1.GetOptions{}); err == nil {
			job = "ended: " + jobEnded(j)
		} else if !apierrors.IsNotFound(err) {
			job = err.Error()
		}
		return false, fmt.Sprintf("anchor of session %s: %d new live Pods, want 1 (all: %d); anchor Job %s; session objects left: %v",
			id, len(live), len(list.Items), job, b.SessionObjects(id))
	})
	return live[0]
}

// endPod writes the terminal status the kubelet (or, for an unscheduled
// Pod, PodGC) reports for an anchor Pod it stopped. There is no kubelet in
// the local stack, so without this a deleted Pod would stay terminating
// forever; everything after it — the Job controller, its pod failure
// policy, the TTL controller and the garbage collector — is the real one.
func endPod(t *testing.T, cs kubernetes.Interface, ns, name string, phase corev1.PodPhase, exitCode int32, reason string, disruption string) {
	t.Helper()
	ctx := context.Background()
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	pod.Status.Phase = phase
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "pause", Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: exitCode, Reason: reason, StartedAt: pod.CreationTimestamp, FinishedAt: now,
		}},
	}}
	if disruption != "" && !hasCondition(pod, corev1.DisruptionTarget) {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
			Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: disruption, LastTransitionTime: now,
		})
	}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("reporting %s for anchor Pod %s: %v", phase, name, err)
	}
}

func hasCondition(pod *corev1.Pod, c corev1.PodConditionType) bool {
	for _, pc := range pod.Status.Conditions {
		if pc.Type == c && pc.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// jobEnded returns the Job's terminal (or about to be) condition, "" if
// none: Failed, FailureTarget, Complete or SuccessCriteriaMet.
func jobEnded(j *batchv1.Job) string {
	for _, c := range j.Status.Conditions {
		switch c.Type {
		case batchv1.JobFailed, batchv1.JobFailureTarget, batchv1.JobComplete, batchv1.JobSuccessCriteriaMet:
			if c.Status == corev1.ConditionTrue {
				return string(c.Type) + " (" + c.Reason + ": " + c.Message + ")"
			}
		}
	}
	return ""
}

// Regression: the anchor Job had backoffLimit 0 and completions 1, so the
// first end of its pause Pod — a drain, an eviction, a node loss, a hand
// delete — ended the Job; the TTL controller deleted it and the garbage
// collector took the student's VMs mid-lab. Now the Pod is replaced and
// the session survives, whichever way the Pod ends.
func TestAnchorSurvivesItsPodEnding(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	ctx := context.Background()
	cs := b.Kube
	s := b.open("s-drained", "k8s-cluster")
	t.Cleanup(func() { _ = b.App.Cluster.Teardown(context.Background(), s) })
	before := b.SessionObjects(s.ID)
	for _, kind := range []string{"VirtualMachine/", "Secret/", "Job/"} {
		if !slices.ContainsFunc(before, func(o string) bool { return strings.HasPrefix(o, kind) }) {
			t.Fatalf("session lacks a %s object: %v", kind, before)
		}
	}
	jobName := session.AnchorName(s.ID)

	type ending struct {
		name string
		// stop is what happens to the Pod: evict (as kubectl drain does),
		// delete (by hand, or PodGC after a node loss), or nothing (it
		// crashes on its own).
		stop string
		// What the kubelet / PodGC then reports.
		phase      corev1.PodPhase
		exitCode   int32
		reason     string
		disruption string
	}
	// Ordered so that no two failures follow each other: the Job controller
	// waits 10s, 20s, 40s… before replacing consecutive failed Pods.
	endings := []ending{
		{"node lost: PodGC fails the Pod with DisruptionTarget", "delete", corev1.PodFailed, 137, "ContainerStatusUnknown", "DeletionByPodGC"},
		// pause exits 0 on SIGTERM: a drained anchor Pod ends Succeeded.
		{"drain: evicted, pause exits 0 on SIGTERM", "evict", corev1.PodSucceeded, 0, "Completed", ""},
		{"drain with the container killed: evicted, exit 137", "evict", corev1.PodFailed, 137, "Error", ""},
		{"deleted by hand: pause exits 0 on SIGTERM", "delete", corev1.PodSucceeded, 0, "Completed", ""},
		// Not a disruption: counts against backoffLimit (1 of 6).
		{"crash: OOM-killed, no disruption", "", corev1.PodFailed, 137, "OOMKilled", ""},
	}
	var old []types.UID
	pod := b.anchorPod(s.ID)
	for _, e := range endings {
		start := time.Now()
		switch e.stop {
		case "evict":
			if err := cs.CoreV1().Pods(b.Namespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: b.Namespace}}); err != nil {
				t.Fatalf("%s: evicting %s: %v", e.name, pod.Name, err)
			}
			got, err := cs.CoreV1().Pods(b.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("%s: the evicted Pod is gone before the Job controller saw it end: %v", e.name, err)
			}
			if !hasCondition(got, corev1.DisruptionTarget) {
				t.Fatalf("%s: the eviction API did not mark the Pod DisruptionTarget: %+v", e.name, got.Status.Conditions)
			}
		case "delete":
			if err := cs.CoreV1().Pods(b.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatalf("%s: deleting %s: %v", e.name, pod.Name, err)
			}
		}
		endPod(t, cs, b.Namespace, pod.Name, e.phase, e.exitCode, e.reason, e.disruption)
		old = append(old, pod.UID)
		pod = b.anchorPod(s.ID, old...)
		job, err := cs.BatchV1().Jobs(b.Namespace).Get(ctx, jobName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: anchor Job: %v", e.name, err)
		}
		if ended := jobEnded(job); ended != "" {
			t.Fatalf("%s: anchor Job ended: %s", e.name, ended)
		}
		t.Logf("%s: replaced by %s after %s (job succeeded=%d failed=%d)", e.name, pod.Name, time.Since(start).Round(100*time.Millisecond), job.Status.Succeeded, job.Status.Failed)
	}

	// Everything of the session is still there, and stays.
	hold := 5 * time.Second
	for end := time.Now().Add(hold); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		job, err := cs.BatchV1().Jobs(b.Namespace).Get(ctx, jobName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("anchor Job: %v", err)
		}
		if ended := jobEnded(job); ended != "" {
			t.Fatalf("anchor Job ended: %s", ended)
		}
		if diff := cmp.Diff(before, b.SessionObjects(s.ID)); diff != "" {
			t.Fatalf("session objects changed (-before +now):\n%s", diff)
		}
	}
	job, err := cs.BatchV1().Jobs(b.Namespace).Get(ctx, jobName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if job.Status.Succeeded != 2 || *job.Spec.Completions <= job.Status.Succeeded {
		t.Errorf("job succeeded=%d of completions %d, want the 2 Pods that exited 0 counted and far from completion", job.Status.Succeeded, *job.Spec.Completions)
	}
	if got := b.status(s.ID); got != session.StatusRunning {
		t.Errorf("session is %s, want running", got)
	}
	t.Logf("%d objects of a 3-node session intact for %s after %d anchor Pod endings (job succeeded=%d failed=%d, backoffLimit %d, completions %d)",
		len(before), hold, len(endings), job.Status.Succeeded, job.Status.Failed, *job.Spec.BackoffLimit, *job.Spec.Completions)
}

// On real KubeVirt each VMI runs in a virt-launcher Pod carrying the VMI's
// labels (labkeep.io/env and labkeep.io/session too); virtsim makes one the
// same way. The inventory must not take it for a workspace Pod, so the
// reaper never deletes it directly — neither for a live session nor as
// part of an orphan, whose launcher Pods go with their VMIs.
func TestInventoryIgnoresVirtLauncherPods(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	ctx := context.Background()
	live := b.open("s-live", "linux-vm")
	orphan := b.open("s-orphan", "linux-vm")
	launchers := func(id string) []string {
		t.Helper()
		list, err := b.Kube.CoreV1().Pods(b.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io=virt-launcher," + kube.LabelSession + "=" + id})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				names = append(names, p.Name)
			}
		}
		return names
	}
	liveLauncher, orphanLauncher := launchers(live.ID), launchers(orphan.ID)
	if len(liveLauncher) != 1 || len(orphanLauncher) != 1 {
		t.Fatalf("launcher Pods: %v and %v, want one per VMI", liveLauncher, orphanLauncher)
	}

	lists := b.Faults.Lists()
	inv, err := b.App.Cluster.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := b.Faults.Lists() - lists; n != 6 {
		t.Errorf("inventory made %d list calls, want 6 (no Secrets)", n)
	}
	var kinds []string
	for _, o := range inv.Objects {
		if o.Kind == session.KindPod || o.Kind == session.KindSecret {
			t.Errorf("inventory holds %s %s", o.Kind, o.Name)
		}
		if o.Session == live.ID {
			kinds = append(kinds, string(o.Kind))
		}
	}
	slices.Sort(kinds)
	// Every session has its NetworkPolicy beside its VM and anchor.
	if want := []string{"Job", "NetworkPolicy", "VirtualMachine"}; !slices.Equal(kinds, want) {
		t.Errorf("live session's inventory objects = %v, want %v", kinds, want)
	}

	b.ForgetRow(orphan.ID)
	r := b.run()
	if r.Counts[reap.Orphan] != 1 || len(r.Failures) != 0 || r.Counts[reap.Ghost] != 0 {
		t.Fatalf("run: counts %v failures %v, want the one orphan", r.Counts, r.Failures)
	}
	for _, it := range r.Items {
		if !slices.Contains(it.Objects, "Job/"+session.AnchorName(orphan.ID)) {
			t.Errorf("orphan item %+v does not delete the anchor", it)
		}
		for _, o := range it.Objects {
			if strings.HasPrefix(o, "Pod/") || strings.HasPrefix(o, "Secret/") {
				t.Errorf("orphan item deleted %s directly", o)
			}
		}
	}
	b.WaitGone(orphan.ID) // launcher Pod and Secret too, by the GC
	if got := launchers(live.ID); !slices.Equal(got, liveLauncher) {
		t.Errorf("live session's launcher Pods %v, want %v untouched", got, liveLauncher)
	}
	if got := b.status(live.ID); got != session.StatusRunning {
		t.Errorf("live session is %s", got)
	}
}

// A workspace Pod's Ready in the inventory follows the Pod: false while
// Pending, true once Running with condition Ready=True (as the kubelet
// reports it; there is no kubelet in the local stack).
func TestInventoryWorkspacePodReady(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	ctx := context.Background()
	opened, err := b.App.Sessions.Open(ctx, "s-shell", "shell", "")
	if err != nil {
		t.Fatal(err)
	}
	s := *opened.Session
	name := session.NodeName(s.ID, s.Nodes[0].Name)
	ready := func() (bool, bool) {
		t.Helper()
		inv, err := b.App.Cluster.Inventory(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range inv.Objects {
			if o.Kind == session.KindPod && o.Name == name {
				return o.Ready, true
			}
		}
		return false, false
	}
	if r, found := ready(); !found || r {
		t.Fatalf("pending workspace Pod: found=%v ready=%v, want found and not ready", found, r)
	}
	pod, err := b.Kube.CoreV1().Pods(b.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if _, err := b.Kube.CoreV1().Pods(b.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r, found := ready(); !found || !r {
		t.Fatalf("running, ready workspace Pod: found=%v ready=%v, want ready", found, r)
	}
	if err := b.App.Cluster.Teardown(ctx, s); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}
