package reap_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/functions/app"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/pgstore"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// Two environments pointed at one database and one sessions namespace by
// mistake: the second is refused at start, naming both; and where that
// check is bypassed (the test rewrites the database's environment, as two
// environments migrating one database at once might), the second
// environment's teardowns, orphan deletes and reaper runs still never
// delete an object of the first's, and report every refusal.
func TestEnvironmentsSharingADatabase(t *testing.T) {
	ctx := context.Background()
	shared := "shared-" + stacktest.Suffix()
	t.Cleanup(func() { // last: after both deployments' own cleanup
		kc, _ := stacktest.AdminClients(t, st)
		_ = kc.CoreV1().Namespaces().Delete(context.Background(), shared, metav1.DeleteOptions{})
	})
	a := newBackend(t, stacktest.Options{Env: "env-a", Namespace: shared})
	if n := a.Count(`SELECT count(*) FROM environment WHERE env = 'env-a'`); n != 1 {
		t.Fatalf("a fresh database does not record the first environment to migrate it (%d rows)", n)
	}

	// (1) Refused at start, with both environments named and what to do;
	// the database is left as it was.
	cfg := a.App.Config
	cfg.Env = "env-b"
	if _, err := app.Build(ctx, cfg, time.Now, stacktest.Discard()); !errors.Is(err, pgstore.ErrOtherEnvironment) ||
		!containsAll(err.Error(), "LABKEEP_DATABASE_URL", `environment "env-a"`, `environment "env-b"`, `"env-b"'s own database`) {
		t.Fatalf("env-b starting on env-a's database: %v; want a refusal naming both and the fix", err)
	}
	if n := a.Count(`SELECT count(*) FROM environment WHERE env = 'env-a'`); n != 1 {
		t.Fatal("the refused start changed the database's environment")
	}

	// Env A's real objects: a running three-node VM session (anchor, Secrets,
	// NetworkPolicy, Service, VMs) and a workspace Pod session (Pending: this
	// suite has no node).
	aVM := a.open("a-vm", "k8s-cluster")
	opened, err := a.App.Sessions.Open(ctx, "a-pod", "shell", "")
	if err != nil {
		t.Fatal(err)
	}
	aPod := *opened.Session
	t.Cleanup(func() {
		_ = a.App.Cluster.Teardown(context.Background(), aVM)
		_ = a.App.Cluster.Teardown(context.Background(), aPod)
	})

	// (2) The check bypassed: env B runs on env A's database and namespace.
	if _, err := a.DB.Exec(ctx, `UPDATE environment SET env = 'env-b'`); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, stacktest.Options{Env: "env-b", Namespace: shared, DatabaseURL: a.App.Config.DatabaseURL})

	// The check refuses nothing of B's own: its session goes entirely, its
	// cloud-init Secret with its anchor (garbage collector).
	own := b.open("b-own", "linux-vm")
	if err := b.App.Cluster.Teardown(ctx, own); err != nil {
		t.Fatalf("env-b tearing down its own session: %v", err)
	}
	b.WaitGone(own.ID)
	b.ForgetRow(own.ID)

	// Objects bearing the names of env B's session x: its Service labelled
	// with another session y of env B, its control Pod without any label.
	x, y := uuid.NewString(), uuid.NewString()
	if _, err := b.Kube.CoreV1().Services(shared).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: session.NetworkName(x), Labels: map[string]string{kube.LabelEnv: "env-b", kube.LabelSession: y}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 22}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Kube.CoreV1().Pods(shared).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: session.NodeName(x, "control")},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: stacktest.AnchorImage}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sx := session.Session{ID: x, Kind: labs.KindPod, Nodes: []session.Node{{Name: "control"}, {Name: "worker-1"}}}

	anchorUID := a.objectUID(session.AnchorName(aVM.ID))
	before := a.everything()
	for _, want := range []string{"Service/" + session.NetworkName(x), "Pod/" + session.NodeName(x, "control"),
		"Job/" + session.AnchorName(aVM.ID), "Service/" + session.NetworkName(aVM.ID), "NetworkPolicy/" + session.NetworkName(aVM.ID),
		"VirtualMachine/" + session.NodeName(aVM.ID, "worker-2"), "Pod/" + session.NodeName(aPod.ID, aPod.Nodes[0].Name)} {
		if !slices.Contains(before, want) {
			t.Fatalf("set-up lacks %s: %v", want, before)
		}
	}

	tests := []struct {
		name string
		del  func() error
		// want are what the refusal must say.
		want []string
	}{
		{"teardown of env A's VM session", func() error { return b.App.Cluster.Teardown(ctx, aVM) },
			[]string{"VirtualMachine/" + session.NodeName(aVM.ID, "control"), "Job/" + session.AnchorName(aVM.ID),
				"Service/" + session.NetworkName(aVM.ID), "NetworkPolicy/" + session.NetworkName(aVM.ID), `environment "env-a"`, `"env-b"`}},
		{"teardown of env A's workspace Pod session", func() error { return b.App.Cluster.Teardown(ctx, aPod) },
			[]string{"Pod/" + session.NodeName(aPod.ID, aPod.Nodes[0].Name), "Job/" + session.AnchorName(aPod.ID), `environment "env-a"`}},
		{"orphan delete of env A's anchor by its UID", func() error {
			return b.App.Cluster.Delete(ctx, session.ObjectRef{Kind: session.KindAnchor, Name: session.AnchorName(aVM.ID), UID: anchorUID})
		}, []string{"Job/" + session.AnchorName(aVM.ID), `environment "env-a"`}},
		{"teardown of a session whose names another session's and an unlabelled object hold", func() error { return b.App.Cluster.Teardown(ctx, sx) },
			[]string{"Service/" + session.NetworkName(x) + `: it belongs to session "` + y + `"`, "Pod/" + session.NodeName(x, "control") + `: it belongs to environment ""`}},
		{"orphan delete of an object labelled with another session than its name's", func() error {
			return b.App.Cluster.Delete(ctx, session.ObjectRef{Kind: session.KindService, Name: session.NetworkName(x)})
		}, []string{"Service/" + session.NetworkName(x), `"` + y + `" is not the session its name belongs to`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.del()
			if !errors.Is(err, session.ErrNotOurs) || !containsAll(err.Error(), tt.want...) {
				t.Fatalf("error %v; want a refusal (session.ErrNotOurs) saying %q", err, tt.want)
			}
			if diff := cmp.Diff(before, a.everything()); diff != "" {
				t.Fatalf("objects changed (-before +after):\n%s", diff)
			}
		})
	}

	// B's reaper: env A's Pod session is a ghost to it (no env-b Pod), the
	// Service labelled y an orphan of env B's; later both env A sessions
	// expire by B's clock. Every delete is refused and reported, nothing is
	// counted as reaped, and env A's rows stay live (a ghost's row marked
	// failed would make env A's own reaper take its objects for orphans).
	b.Clock.Advance(3 * time.Minute)
	r := b.run()
	wantFailure(t, r, reap.Ghost, aPod.ID, "", `environment "env-a"`)
	wantFailure(t, r, reap.Orphan, y, "Service/"+session.NetworkName(x), "is not the session its name belongs to")
	b.Clock.Advance(2 * time.Hour)
	r2 := b.run()
	wantFailure(t, r2, reap.Expired, aVM.ID, "", `environment "env-a"`)
	wantFailure(t, r2, reap.Expired, aPod.ID, "", `environment "env-a"`)
	for i, rep := range []reap.Report{r, r2} {
		if n := rep.Counts[reap.Expired] + rep.Counts[reap.Ghost] + rep.Counts[reap.Orphan]; n != 0 {
			t.Errorf("env B's run %d counts %v reaped, all of it refused", i+1, rep.Counts)
		}
	}
	for id, want := range map[string]session.Status{aVM.ID: session.StatusRunning, aPod.ID: session.StatusProvisioning} {
		if got := a.status(id); got != want {
			t.Errorf("env A's session %s is %s after env B's refused runs, want %s (still live)", id, got, want)
		}
	}
	if diff := cmp.Diff(before, a.everything()); diff != "" {
		t.Fatalf("env B's reaper changed the shared namespace (-before +after):\n%s", diff)
	}

	// (3) The environments' reaper locks differ on the one database; within
	// one environment the lock excludes.
	unlockA, ok, err := a.App.Store.TryLock(ctx, reap.LockName)
	if err != nil || !ok {
		t.Fatalf("env-a reaper lock: ok=%v err=%v", ok, err)
	}
	defer unlockA()
	if _, ok, err := a.App.Store.TryLock(ctx, reap.LockName); err != nil || ok {
		t.Fatalf("env-a took its reaper lock twice (ok=%v err=%v)", ok, err)
	}
	unlockB, ok, err := b.App.Store.TryLock(ctx, reap.LockName)
	if err != nil || !ok {
		t.Fatalf("env-b's reaper lock is held while env-a holds its own (ok=%v err=%v): the keys collide", ok, err)
	}
	unlockB()
}

// objectUID is the UID of the anchor Job called name in b's sessions
// namespace.
func (b *backend) objectUID(name string) string {
	b.t.Helper()
	j, err := b.Kube.BatchV1().Jobs(b.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		b.t.Fatal(err)
	}
	return string(j.UID)
}

// wantFailure fails t unless r reports a failure of kind for session id
// (and object, if given) whose error is a refusal saying each of want.
func wantFailure(t *testing.T, r reap.Report, kind reap.ItemKind, id, object string, want ...string) {
	t.Helper()
	for _, f := range r.Failures {
		if f.Kind == kind && f.Session == id && (object == "" || f.Object == object) &&
			containsAll(f.Error, append([]string{session.ErrNotOurs.Error()}, want...)...) {
			return
		}
	}
	t.Errorf("run reports no %s refusal for session %s %s saying %q; failures: %+v", kind, id, object, want, r.Failures)
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
