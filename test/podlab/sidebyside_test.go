package podlab_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// A multi-node VM lab (three VMs under virtsim, their virt-launcher Pods
// really running on the node) and a Pod lab run side by side on one stack.
// When the workspace Pod is deleted behind labkeep's back, the next reaper
// run ends that session as a ghost — the row failed with the ghost reason,
// the student told to open again — and leaves the VM lab alone; the
// student opens the lab again and logs in.
func TestVMLabAndPodLabSideBySide(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{})
	ctx := context.Background()
	vm := d.Opened("henry", "k8s-cluster")
	shell := openLab(t, d, "ivy", "shell", nil)
	vmView := d.WaitRunning("henry", 3*time.Minute)
	shell.waitRunning(3 * time.Minute)
	shell.waitSSH(time.Minute)

	launchers := func() []string {
		list, err := d.Kube.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelSession + "=" + vm.ID + ",kubevirt.io=virt-launcher"})
		if err != nil {
			t.Fatal(err)
		}
		var running []string
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == st.Node.Name {
				running = append(running, p.Name)
			}
		}
		return running
	}
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		l := launchers()
		return len(l) == 3, fmt.Sprintf("running virt-launcher Pods of the VM lab: %v", l)
	})
	if len(vmView.Nodes) != 3 {
		t.Fatalf("the VM lab has nodes %+v, want 3", vmView.Nodes)
	}
	vmObjects := d.SessionObjects(vm.ID)

	// Someone deletes the workspace Pod by hand.
	if err := d.Kube.CoreV1().Pods(d.Namespace).Delete(ctx, shell.podName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		return shell.pod() == nil, "workspace Pod still there: " + shell.podState()
	})
	// A Pod missing at one look is only a suspect (it may be coming back);
	// missing again at a look AbsentConfirm later, it is a ghost.
	if r := d.Do("POST", "/reapTick", stacktest.SchedulerToken, "", ""); r.Status != http.StatusOK {
		t.Fatalf("reapTick: %d %s", r.Status, r.Body)
	}
	if code, seen := shell.get(); code != http.StatusOK || seen.Status != "running" {
		t.Errorf("ivy's getSession after one look without her Pod: %d %s; want still running", code, seen.Status)
	}
	d.Clock.Advance(reap.DefaultConfig().AbsentConfirm + time.Second)
	if r := d.Do("POST", "/reapTick", stacktest.SchedulerToken, "", ""); r.Status != http.StatusOK {
		t.Fatalf("reapTick: %d %s", r.Status, r.Body)
	}
	var kind, actor, status string
	if err := d.DB.QueryRow(ctx, "SELECT status, end_kind, end_actor FROM sessions WHERE id = $1", shell.opened.ID).Scan(&status, &kind, &actor); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || kind != "ghost" || actor != "reaper" {
		t.Errorf("the session of the deleted Pod: status %s, ended %s by %s; want failed, ghost, reaper", status, kind, actor)
	}
	if code, seen := shell.get(); code != http.StatusOK || seen.Status != "failed" || seen.FailureReason != session.Sentence(session.EndGhost) {
		t.Errorf("ivy's getSession after the reaper: %d %s %q; want failed with the ghost sentence", code, seen.Status, seen.FailureReason)
	}
	d.WaitGone(shell.opened.ID)

	if got := d.WaitRunning("henry", time.Minute); got.ID != vm.ID {
		t.Errorf("the VM lab's session is now %s, want %s", got.ID, vm.ID)
	}
	if got := d.SessionObjects(vm.ID); fmt.Sprint(got) != fmt.Sprint(vmObjects) {
		t.Errorf("the VM lab's objects changed: %v, were %v", got, vmObjects)
	}
	if l := launchers(); len(l) != 3 {
		t.Errorf("the VM lab's launcher Pods: %v", l)
	}

	again := openLab(t, d, "ivy", "shell", nil)
	if again.opened.ID == shell.opened.ID {
		t.Fatalf("the reopened session has the ghost's id %s", again.opened.ID)
	}
	again.waitRunning(3 * time.Minute)
	if out := again.mustRun("id -u"); out != "0\n" {
		t.Errorf("id -u in the reopened lab: %q", out)
	}
	t.Logf("VM lab (3 VMs) and Pod lab ran side by side; the deleted Pod's session was reaped as a ghost; reopened lab running %s after its open",
		again.runningAt.Sub(again.openedAt).Round(10*time.Millisecond))
	for _, who := range []string{"henry", "ivy"} {
		if r := d.Close(who); r.Status != http.StatusOK {
			t.Errorf("close of %s: %d %s", who, r.Status, r.Body)
		}
	}
	d.WaitNoObjects()
}
