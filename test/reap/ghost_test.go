package reap_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
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
	b.WaitGone(gone.ID, 30*time.Second)
	b.WaitGone(lost.ID, 30*time.Second)
}
