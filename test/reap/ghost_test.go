package reap_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"labkeep/localrun/stacktest"
	"labkeep/localrun/virtsim"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// loseVMI makes the stand-in KubeVirt delete the VMI of VM name and not
// recreate it (lost) or recreate it (back), and waits until the API server
// shows that.
func (b *backend) loseVMI(name string, lost bool) {
	b.t.Helper()
	ctx := context.Background()
	value := any(nil) // a merge patch with null removes the annotation
	if lost {
		value = "true"
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{virtsim.AnnotationLost: value}}})
	if _, err := b.Dyn.Resource(stacktest.Resource("VirtualMachine")).Namespace(b.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		b.t.Fatal(err)
	}
	stacktest.Eventually(b.t, 30*time.Second, func() (bool, string) {
		vmi, err := b.Dyn.Resource(stacktest.Resource("VirtualMachineInstance")).Namespace(b.Namespace).Get(ctx, name, metav1.GetOptions{})
		gone := apierrors.IsNotFound(err)
		if err != nil && !gone {
			b.t.Fatal(err)
		}
		if !gone && vmi.GetDeletionTimestamp() != nil {
			return false, "VMI " + name + " is being deleted"
		}
		return gone == lost, "VMI " + name + " still there (or not yet back)"
	})
}

// suspects are the suspects the reaper handed on, as object/trouble.
func (b *backend) suspects() []string {
	b.t.Helper()
	s, err := b.App.Store.Suspects(context.Background())
	if err != nil {
		b.t.Fatal(err)
	}
	var out []string
	for _, x := range s {
		out = append(out, x.Object+" "+string(x.Trouble))
	}
	return out
}

// A VMI that KubeVirt deletes and recreates between two runs (a guest
// poweroff under runStrategy Always, a drain without live migration) never
// ends its session: the first run only suspects it, the second sees it
// back and clears the suspect. A VM that is really gone is still a ghost at
// the next run, and a VMI that stays missing at the run after.
func TestRecreatedVMIIsNoGhost(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	flap := b.open("s-flap", "linux-vm")
	lost := b.open("s-lost", "linux-vm")
	gone := b.open("s-gone", "linux-vm")
	flapVM, lostVM := session.NodeName(flap.ID, flap.Nodes[0].Name), session.NodeName(lost.ID, lost.Nodes[0].Name)

	b.loseVMI(flapVM, true)
	b.loseVMI(lostVM, true)
	b.deleteVM(gone, gone.Nodes[0].Name)
	r := b.run()
	if r.Counts[reap.Ghost] != 1 || len(r.Failures) != 0 || b.status(gone.ID) != session.StatusFailed {
		t.Fatalf("first run: counts %v failures %v; want the session whose VM is gone, and only it, ended", r.Counts, r.Failures)
	}
	for _, s := range []session.Session{flap, lost} {
		if got := b.status(s.ID); got != session.StatusRunning {
			t.Fatalf("session %s is %s after one look at its missing VMI", s.Student, got)
		}
	}
	// Each VMI is missing, and each VM reported Stopped meanwhile.
	want := []string{"VirtualMachine/" + flapVM + " down", "VirtualMachineInstance/" + flapVM + " missing",
		"VirtualMachine/" + lostVM + " down", "VirtualMachineInstance/" + lostVM + " missing"}
	if diff := cmp.Diff(want, b.suspects(), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Fatalf("suspects after the first run (-want +got):\n%s", diff)
	}

	b.loseVMI(flapVM, false) // KubeVirt recreates it
	b.Clock.Advance(reap.SchedulePeriod)
	r = b.run()
	if r.Counts[reap.Ghost] != 1 || len(r.Failures) != 0 || b.status(lost.ID) != session.StatusFailed {
		t.Fatalf("second run: counts %v failures %v; want the VMI missing at both looks ended", r.Counts, r.Failures)
	}
	b.Clock.Advance(reap.SchedulePeriod)
	if r = b.run(); r.Counts[reap.Ghost] != 0 || len(r.Failures) != 0 {
		t.Fatalf("third run: counts %v failures %v; nothing is left to reap", r.Counts, r.Failures)
	}
	if got := b.Session(flap.ID); got.Status != session.StatusRunning {
		t.Fatalf("the session whose VMI was recreated is %s (%s)", got.Status, got.End)
	}
	if s := b.suspects(); len(s) != 0 {
		t.Fatalf("suspects left after every node is back or reaped: %v", s)
	}
	b.WaitGone(gone.ID)
	b.WaitGone(lost.ID)
}

// runningShell opens a workspace Pod session for student and reports its
// Pod Running and Ready as a kubelet would (the reaper's suite runs
// without a node), so the session reads running.
func (b *backend) runningShell(student string) (session.Session, *corev1.Pod) {
	b.t.Helper()
	ctx := context.Background()
	opened, err := b.App.Sessions.Open(ctx, student, "shell", "")
	if err != nil {
		b.t.Fatal(err)
	}
	s := *opened.Session
	pod, err := b.Kube.CoreV1().Pods(b.Namespace).Get(ctx, session.NodeName(s.ID, s.Nodes[0].Name), metav1.GetOptions{})
	if err != nil {
		b.t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if pod, err = b.Kube.CoreV1().Pods(b.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		b.t.Fatal(err)
	}
	got, err := b.App.Sessions.Get(ctx, student, s.ID)
	if err != nil {
		b.t.Fatalf("shell session of %s: %v, want running", student, err)
	}
	if s = *got.Session; s.Status != session.StatusRunning {
		b.t.Fatalf("shell session of %s: %s, want running", student, s.Status)
	}
	return s, pod
}

// Workspace Pods likewise: a Pod deleted behind labkeep's back is a ghost
// at the second look, one that has ended (evicted: phase Failed) only once
// the runs have seen it so for the down grace.
func TestWorkspacePodGhostsAreConfirmed(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	ctx := context.Background()
	gone, gonePod := b.runningShell("s-pod-gone")
	ended, endedPod := b.runningShell("s-pod-ended")
	if err := b.Kube.CoreV1().Pods(b.Namespace).Delete(ctx, gonePod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, stacktest.GoneWithin, func() (bool, string) {
		_, err := b.Kube.CoreV1().Pods(b.Namespace).Get(ctx, gonePod.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), "workspace Pod still there"
	})
	endedPod.Status.Phase, endedPod.Status.Reason = corev1.PodFailed, "Evicted"
	if _, err := b.Kube.CoreV1().Pods(b.Namespace).UpdateStatus(ctx, endedPod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	grace := b.App.Reaper.Config.DownGrace
	for i, step := range []struct {
		advance   time.Duration
		wantEnded []string
	}{
		{0, nil},                                 // first look: both only suspected
		{reap.SchedulePeriod, []string{gone.ID}}, // the Pod is missing again: ghost
		{grace - reap.SchedulePeriod, []string{ended.ID}}, // ended for the whole grace: ghost
	} {
		b.Clock.Advance(step.advance)
		r := b.run()
		var got []string
		for _, it := range r.Items {
			got = append(got, it.Session)
		}
		if diff := cmp.Diff(step.wantEnded, got); diff != "" || len(r.Failures) != 0 {
			t.Fatalf("run %d: ghosts (-want +got):\n%s(failures %v)", i, diff, r.Failures)
		}
	}
	for id, why := range map[string]string{gone.ID: "missing at every look since", ended.ID: "ended (phase Failed, Evicted) since"} {
		if got := b.Session(id); got.Status != session.StatusFailed || got.End.Kind != session.EndGhost || !strings.Contains(got.End.Detail, why) {
			t.Fatalf("session %s: %s %q, want a ghost saying %q", id, got.Status, got.End, why)
		}
		b.WaitGone(id)
	}
}
