package reap_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"labkeep/localrun/stacktest"
	"labkeep/shared/pgstore"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// unlabelledVM creates a VM without any labkeep label in b's sessions
// namespace.
func (b *backend) unlabelledVM(name string) {
	b.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"runStrategy": "Always", "template": map[string]any{"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{}}}}},
	}}
	if _, err := b.Dyn.Resource(stacktest.Resource("VirtualMachine")).Namespace(b.Namespace).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		b.t.Fatal(err)
	}
}

// everything names every object in b's sessions namespace but the anchor
// Pods, whoever made it.
func (b *backend) everything() []string {
	b.t.Helper()
	return stacktest.Names(b.List(stacktest.Listing{LeaveOutAnchorPods: true}))
}

// deleteVM deletes node's VM of session s behind labkeep's back.
func (b *backend) deleteVM(s session.Session, node string) {
	b.t.Helper()
	if err := b.Dyn.Resource(stacktest.Resource("VirtualMachine")).Namespace(b.Namespace).Delete(context.Background(), session.NodeName(s.ID, node), metav1.DeleteOptions{}); err != nil {
		b.t.Fatal(err)
	}
}

// Regression for the incident where a dev reaper sharing the
// VM namespace with prod deleted a prod student's VM 26 s after boot,
// taking it for an orphan because it was not in dev's database.
func TestDevReaperNeverTouchesProd(t *testing.T) {
	shared := "shared-" + stacktest.Suffix()
	prod := newBackend(t, stacktest.Options{Env: "prod", Namespace: shared})
	dev := newBackend(t, stacktest.Options{Env: "dev", Namespace: shared})

	student := prod.open("alice", "linux-vm")
	prod.unlabelledVM("hand-made-vm")
	prodOrphan := prod.open("bob", "linux-vm")
	prod.ForgetRow(prodOrphan.ID) // prod's own orphan
	before := prod.everything()

	for i := range 3 {
		r := dev.run()
		if n := r.Counts[reap.Orphan] + r.Counts[reap.Expired] + r.Counts[reap.Ghost]; n != 0 || len(r.Failures) != 0 {
			t.Fatalf("dev run %d reaped %v with failures %v in a namespace holding only prod's and unlabelled objects", i, r.Counts, r.Failures)
		}
	}
	if diff := cmp.Diff(before, prod.everything()); diff != "" {
		t.Fatalf("dev reaper changed the shared namespace (-before +after):\n%s", diff)
	}

	r := prod.run()
	if r.Counts[reap.Orphan] != 1 || len(r.Failures) != 0 {
		t.Fatalf("prod run: counts %v failures %v, want exactly its one orphan", r.Counts, r.Failures)
	}
	prod.WaitGone(prodOrphan.ID)
	if got := prod.Session(student.ID); got.Status != session.StatusRunning {
		t.Fatalf("prod student's session is %s (%s) after both reapers ran; prod run %+v", got.Status, got.End, r)
	}
	left := prod.everything()
	for _, want := range []string{"VirtualMachine/hand-made-vm", "VirtualMachine/" + session.NodeName(student.ID, student.Nodes[0].Name)} {
		if !slices.Contains(left, want) {
			t.Fatalf("%s is gone; left: %v", want, left)
		}
	}
}

// Regression for the incident where one row whose delete
// threw on every run stopped every run, so everything behind it piled up.
func TestOneFailingDeleteDoesNotStallTheRun(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	stuck := b.open("s-stuck", "linux-vm")
	exp1 := b.open("s-exp1", "linux-vm")
	exp2 := b.open("s-exp2", "k8s-cluster")
	b.Clock.Advance(61 * time.Minute) // the three above expire
	ghost := b.open("s-ghost", "linux-vm")
	orphan := b.open("s-orphan", "linux-vm")
	b.ForgetRow(orphan.ID)
	b.deleteVM(ghost, ghost.Nodes[0].Name)
	b.Faults.FailDeletesOf(stuck.ID)

	for run := range 2 { // fails on every run, not just once
		r := b.run()
		want := map[reap.ItemKind]int{reap.Expired: 2, reap.Ghost: 1, reap.Orphan: 1}
		if run > 0 {
			want = map[reap.ItemKind]int{}
		}
		if diff := cmp.Diff(want, r.Counts, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("run %d: counts (-want +got):\n%s(failures %v)", run, diff, r.Failures)
		}
		if len(r.Failures) == 0 || !allAbout(r.Failures, stuck.ID) {
			t.Fatalf("run %d: failures %+v, want only session %s's", run, r.Failures, stuck.ID)
		}
		if got := b.status(stuck.ID); got != session.StatusRunning {
			t.Fatalf("run %d: failing session is %s; it must stay live for the next run", run, got)
		}
	}
	for id, want := range map[string]session.Status{exp1.ID: session.StatusExpired, exp2.ID: session.StatusExpired, ghost.ID: session.StatusFailed} {
		if got := b.status(id); got != want {
			t.Fatalf("session %s is %s, want %s", id, got, want)
		}
		b.WaitGone(id)
	}
	b.WaitGone(orphan.ID)
	runs, err := b.App.Store.RecentRuns(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || len(runs[0].Failures) == 0 || len(runs[1].Failures) == 0 {
		t.Fatalf("stored runs do not show the failures: %+v", runs)
	}

	b.Faults.Heal()
	r := b.run()
	if r.Counts[reap.Expired] != 1 || len(r.Failures) != 0 {
		t.Fatalf("after the fault is gone: counts %v failures %v, want the stuck session expired", r.Counts, r.Failures)
	}
	if got := b.status(stuck.ID); got != session.StatusExpired {
		t.Fatalf("stuck session is %s after healing", got)
	}
	b.WaitGone(stuck.ID)
}

func allAbout(fs []reap.Failure, id string) bool {
	for _, f := range fs {
		if f.Session != id {
			return false
		}
	}
	return true
}

// liveHook is a Store whose ListLive runs a function after listing: the
// window between the reaper reading the rows and reading the cluster.
type liveHook struct {
	reap.Store
	after func()
}

func (h *liveHook) ListLive(ctx context.Context) ([]session.Session, error) {
	live, err := h.Store.ListLive(ctx)
	if h.after != nil {
		h.after()
	}
	return live, err
}

// The backend crashes between creating a VM and writing its
// row: the next run reaps the orphan. A session created while a run is in
// progress is not reaped.
func TestCrashOrphanReapedButNewSessionSurvives(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	ctx := context.Background()
	lab, _ := b.App.Labs.Get("linux-vm")
	crashed := session.Session{ID: "0d5c9e4e-0000-4000-8000-00000000c0de", Student: "s-crash", Lab: lab.Name, Kind: lab.Kind,
		Status: session.StatusProvisioning, Window: b.App.Sessions.Policy.Open(b.Clock.Now()), Nodes: []session.Node{{Name: lab.Nodes[0].Name, Role: lab.Nodes[0].Role}}}
	if err := b.App.Cluster.Provision(ctx, crashed, lab); err != nil { // objects, no row
		t.Fatal(err)
	}
	if len(b.SessionObjects(crashed.ID)) == 0 {
		t.Fatal("crashed provisioning created nothing")
	}

	var fresh session.Session
	b.App.Reaper.Store = &liveHook{Store: b.App.Store, after: func() {
		// Opened after the run read the rows, before it lists the cluster.
		opened, err := b.App.Sessions.Open(ctx, "s-fresh", "linux-vm", "")
		if err != nil {
			t.Errorf("open during the run: %v", err)
		}
		if opened.Session != nil {
			fresh = *opened.Session
		}
	}}
	r := b.run()
	if r.Counts[reap.Orphan] != 1 || len(r.Failures) != 0 {
		t.Fatalf("run: counts %v failures %v, want the crash orphan only", r.Counts, r.Failures)
	}
	b.WaitGone(crashed.ID)
	if got := b.status(fresh.ID); !got.Live() {
		t.Fatalf("session opened during the run is %s", got)
	}
	if objs := b.SessionObjects(fresh.ID); !slices.Contains(objs, "VirtualMachine/"+session.NodeName(fresh.ID, fresh.Nodes[0].Name)) {
		t.Fatalf("session opened during the run lost its VM: %v", objs)
	}
}

// A VM deleted out-of-band: its session becomes a ghost at the next run;
// one whose VMI vanished (node lost), at the run that sees it missing a
// second time. Each is marked failed with the reason, and the student can
// open a new lab at once.
func TestGhostMarkedFailedAndStudentCanReopen(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	ctx := context.Background()
	deleted := b.open("s-deleted", "linux-vm")
	vanished := b.open("s-vanished", "linux-vm")
	b.deleteVM(deleted, deleted.Nodes[0].Name)
	if err := st.Sim.Vanish(ctx, b.Namespace, session.NodeName(vanished.ID, vanished.Nodes[0].Name)); err != nil {
		t.Fatal(err)
	}
	r := b.run()
	if r.Counts[reap.Ghost] != 1 || len(r.Failures) != 0 || b.status(vanished.ID) != session.StatusRunning {
		t.Fatalf("first run: counts %v failures %v, want the deleted VM's ghost only", r.Counts, r.Failures)
	}
	b.Clock.Advance(reap.SchedulePeriod)
	if r = b.run(); r.Counts[reap.Ghost] != 1 || len(r.Failures) != 0 {
		t.Fatalf("second run: counts %v failures %v, want the vanished VMI's ghost", r.Counts, r.Failures)
	}
	for _, g := range []struct {
		s   session.Session
		why string
	}{{deleted, "no longer exists"}, {vanished, "missing at every look since"}} {
		s := g.s
		got := b.Session(s.ID)
		if got.Status != session.StatusFailed || got.End.Kind != session.EndGhost || got.End.Actor != session.ActorReaper || !strings.Contains(got.End.Detail, g.why) {
			t.Fatalf("ghost %s: status %s reason %q", s.ID, got.Status, got.End)
		}
		b.WaitGone(s.ID)
		again := b.open(s.Student, "linux-vm")
		if again.ID == s.ID {
			t.Fatal("reopen returned the ghost")
		}
	}
}

// With every labkeep process stopped, the deadline anchors
// alone delete the VMs and Secrets at max lifetime + grace.
func TestAnchorsAloneReclaimEverything(t *testing.T) {
	// Max lifetime 3s + grace 2s: the anchor's activeDeadlineSeconds is 5.
	b := newBackend(t, stacktest.Options{Lifetime: time.Second, DeadlineGrace: 2 * time.Second})
	opened := time.Now()
	s := b.open("s-anchor", "k8s-cluster")
	objs := b.SessionObjects(s.ID)
	for _, kind := range []string{"VirtualMachine/", "Secret/", "Job/", "Service/", "NetworkPolicy/"} {
		if !slices.ContainsFunc(objs, func(o string) bool { return strings.HasPrefix(o, kind) }) {
			t.Fatalf("3-node session lacks a %s object: %v", kind, objs)
		}
	}
	// No reaper and no function runs from here on.
	b.WaitGone(s.ID)
	took := time.Since(opened)
	if took < 5*time.Second-500*time.Millisecond {
		t.Fatalf("objects gone %s after open, before max lifetime + grace (5s)", took)
	}
	if got := b.status(s.ID); got != session.StatusRunning {
		t.Fatalf("row is %s; nothing but Kubernetes should have acted", got)
	}
	t.Logf("all %d objects of a 3-node session deleted by Kubernetes alone %s after open (deadline 5s)", len(objs), took.Round(100*time.Millisecond))
}

// Two reapers (two replicas with their own connection pools)
// running concurrently for 20 runs: no errors, each item reaped exactly once.
func TestConcurrentReapersReapEachItemOnce(t *testing.T) {
	a := newBackend(t, stacktest.Options{})
	ctx := context.Background()
	const expiring, orphans = 6, 4
	var ids []string
	for i := range expiring {
		ids = append(ids, a.open(fmt.Sprintf("s-exp-%d", i), "linux-vm").ID)
	}
	a.Clock.Advance(61 * time.Minute)
	for i := range orphans {
		s := a.open(fmt.Sprintf("s-orphan-%d", i), "linux-vm")
		a.ForgetRow(s.ID)
		ids = append(ids, s.ID)
	}
	// Replica b: same database and environment, its own pool and clients.
	second, err := pgstore.Open(ctx, a.App.Store.Conns().Config().ConnString(), a.Env)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	replica := *a.App.Reaper
	replica.Store = second

	var (
		mu     sync.Mutex
		counts = map[reap.ItemKind]int{}
		busy   int
		items  = map[string]int{}
	)
	for run := range 20 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, r := range []*reap.Reaper{a.App.Reaper, &replica} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				rep, err := r.RunOnce(ctx, reap.TriggerSchedule)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, reap.ErrBusy):
					busy++
				case err != nil:
					t.Errorf("run %d: %v", run, err)
				default:
					for k, n := range rep.Counts {
						counts[k] += n
					}
					for _, it := range rep.Items {
						items[it.Session]++
					}
					if len(rep.Failures) > 0 {
						t.Errorf("run %d: failures %+v", run, rep.Failures)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
	}
	if counts[reap.Expired] != expiring || counts[reap.Orphan] != orphans {
		t.Fatalf("reaped %v over 40 runs, want %d expired and %d orphans exactly", counts, expiring, orphans)
	}
	for _, id := range ids {
		if items[id] != 1 {
			t.Fatalf("session %s reaped %d times", id, items[id])
		}
		a.WaitGone(id)
	}
	t.Logf("40 runs from two replicas: %d returned busy, every one of %d items reaped exactly once", busy, len(ids))
}

// A run over 200 expired sessions completes inside the run
// deadline, and the number of list calls per run does not grow with the
// number of session rows.
func TestTwoHundredExpiredWithinDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 200 sessions")
	}
	const runDeadline = 50 * time.Second
	listsFor := func(n int) (lists int64, took time.Duration, rep reap.Report) {
		b := newBackend(t, stacktest.Options{RunDeadline: runDeadline})
		ctx := context.Background()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if _, err := b.App.Sessions.Open(ctx, fmt.Sprintf("s-%04d", i), "linux-vm", ""); err != nil {
					t.Errorf("open %d: %v", i, err)
				}
			}()
		}
		wg.Wait()
		b.Clock.Advance(61 * time.Minute)
		before := b.Faults.Lists()
		start := time.Now()
		rep = b.run()
		took = time.Since(start)
		if rep.Counts[reap.Expired] != n || len(rep.Failures) != 0 {
			t.Fatalf("%d sessions: counts %v, %d failures (first %+v)", n, rep.Counts, len(rep.Failures), first(rep.Failures))
		}
		if left := b.Count("SELECT count(*) FROM sessions WHERE status IN ('provisioning','running')"); left != 0 {
			t.Fatalf("%d sessions still live after the run", left)
		}
		return b.Faults.Lists() - before, took, rep
	}
	smallLists, smallTook, _ := listsFor(10)
	bigLists, bigTook, rep := listsFor(200)
	if bigLists != smallLists {
		t.Fatalf("list calls per run: %d with 10 sessions, %d with 200: must not grow with rows", smallLists, bigLists)
	}
	if rep.FinishedAt.Sub(rep.StartedAt) >= runDeadline {
		t.Fatalf("200-session run took %s, not inside the %s deadline", rep.FinishedAt.Sub(rep.StartedAt), runDeadline)
	}
	t.Logf("run over 10 expired sessions: %s, %d list calls; over 200: %s, %d list calls (deadline %s)",
		smallTook.Round(time.Millisecond), smallLists, bigTook.Round(time.Millisecond), bigLists, runDeadline)
}

func first(fs []reap.Failure) reap.Failure {
	if len(fs) == 0 {
		return reap.Failure{}
	}
	return fs[0]
}

// A dry run reports what it would reap and changes nothing.
func TestDryRunDeletesNothing(t *testing.T) {
	b := newBackend(t, stacktest.Options{DryRun: true})
	s := b.open("s-dry", "linux-vm")
	o := b.open("s-dry-orphan", "linux-vm")
	b.ForgetRow(o.ID)
	b.Clock.Advance(61 * time.Minute)
	before := b.everything()
	rep := b.run()
	if !rep.DryRun || rep.Counts[reap.Expired] != 1 || rep.Counts[reap.Orphan] != 1 || len(rep.Items) != 2 {
		t.Fatalf("dry run report: %+v", rep)
	}
	if diff := cmp.Diff(before, b.everything()); diff != "" {
		t.Fatalf("dry run changed the namespace (-before +after):\n%s", diff)
	}
	if got := b.status(s.ID); got != session.StatusRunning {
		t.Fatalf("dry run marked the session %s", got)
	}
	if n := b.Faults.Deletes(); n != 0 {
		t.Fatalf("dry run sent %d DELETE requests", n)
	}
}

// An extension that lands after the run read the rows but before it
// deletes is honoured: the reaper re-reads the row under its lock, sees the
// new expiry and leaves the session alone (the plan alone would have torn
// it down and marked it expired).
func TestExtensionDuringRunIsHonoured(t *testing.T) {
	b := newBackend(t, stacktest.Options{})
	ctx := context.Background()
	s := b.open("s-extend", "linux-vm")
	// One second before expiry, frozen: however long the run takes to
	// reach its plan on a loaded machine, only the hook moves time.
	b.Clock.Set(s.ExpiresAt.Add(-time.Second))
	b.App.Reaper.Store = &liveHook{Store: b.App.Store, after: func() {
		if _, err := b.App.Sessions.Extend(ctx, s.Student, s.ID); err != nil {
			t.Errorf("extend during the run: %v", err)
		}
		b.Clock.Advance(2 * time.Second) // the old expiry has passed when the run plans
	}}
	r := b.run()
	if r.Counts[reap.Expired] != 0 || len(r.Failures) != 0 {
		t.Fatalf("run after an extension: counts %v failures %v, want nothing reaped", r.Counts, r.Failures)
	}
	got := b.Session(s.ID)
	if got.Status != session.StatusRunning || !got.ExpiresAt.After(s.ExpiresAt) {
		t.Fatalf("extended session is %s, expires %s (was %s)", got.Status, got.ExpiresAt, s.ExpiresAt)
	}
	if objs := b.SessionObjects(s.ID); !slices.Contains(objs, "VirtualMachine/"+session.NodeName(s.ID, s.Nodes[0].Name)) {
		t.Fatalf("extended session lost its VM: %v", objs)
	}
}
