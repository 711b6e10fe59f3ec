// Package reap_test runs the reaper on the real local stack: sessions are
// opened through session.Service as the ServiceAccount bound by
// infra/rbac.yaml, faults are injected in the HTTP transport to the real
// API server, and every assertion reads the real cluster and database.
package reap_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"labkeep/infra"
	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/localrun/virtsim"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/pgstore"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	stacktest.Main(m, &st, stack.Options{VirtSim: virtsim.Options{BootDelay: 300 * time.Millisecond}})
}

// faults is a RoundTripper in front of the API server that fails DELETE
// requests whose path contains a chosen substring, and counts LIST calls.
type faults struct {
	next       http.RoundTripper
	mu         sync.Mutex
	failDelete []string
	lists      atomic.Int64
	deletes    atomic.Int64
}

func (f *faults) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodDelete {
		f.deletes.Add(1)
		f.mu.Lock()
		fail := false
		for _, s := range f.failDelete {
			if strings.Contains(req.URL.Path, s) {
				fail = true
			}
		}
		f.mu.Unlock()
		if fail {
			return nil, fmt.Errorf("injected fault: connection reset deleting %s", req.URL.Path)
		}
	}
	if req.Method == http.MethodGet && isList(req.URL) {
		f.lists.Add(1)
	}
	return f.next.RoundTrip(req)
}

// isList: a collection GET (…/namespaces/<ns>/<resource>) without a name.
func isList(u *url.URL) bool {
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			return len(parts) == i+3
		}
	}
	return false
}

// FailDeletesOf makes every DELETE whose path contains s fail until Heal.
func (f *faults) FailDeletesOf(s string) {
	f.mu.Lock()
	f.failDelete = append(f.failDelete, s)
	f.mu.Unlock()
}

// Heal removes every injected fault.
func (f *faults) Heal() {
	f.mu.Lock()
	f.failDelete = nil
	f.mu.Unlock()
}

// backend is one environment's deployment of the functions and reaper: its
// own database and labkeep.io/env, running as its own ServiceAccount.
type backend struct {
	t       *testing.T
	env, ns string
	clock   *stacktest.Clock
	faults  *faults
	store   *pgstore.PG
	cluster *kube.Cluster
	svc     *session.Service
	reaper  *reap.Reaper
	db      *pgxpool.Pool
}

type backendOptions struct {
	env       string // labkeep.io/env (random if empty)
	namespace string // sessions namespace (a new one if empty)
	lifetime  time.Duration
	grace     time.Duration // deadline grace (default 15m)
	maxVMs    int
	dryRun    bool
	deadline  time.Duration
}

func admin(t *testing.T) (kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(st.Admin())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(st.Admin())
	if err != nil {
		t.Fatal(err)
	}
	return cs, dyn
}

func newBackend(t *testing.T, o backendOptions) *backend {
	t.Helper()
	ctx := context.Background()
	if o.env == "" {
		o.env = "env-" + stacktest.Suffix()
	}
	if o.namespace == "" {
		o.namespace = "reap-" + stacktest.Suffix()
	}
	if o.lifetime == 0 {
		o.lifetime = time.Hour
	}
	if o.grace == 0 {
		o.grace = 15 * time.Minute
	}
	if o.maxVMs == 0 {
		o.maxVMs = 1000
	}
	fnNS := o.env + "-fn-" + stacktest.Suffix()
	cs, _ := admin(t)
	// The manifests as shipped; a second environment sharing the sessions
	// namespace gets its own RoleBinding to the same Role, as an operator
	// would add.
	if err := infra.Apply(ctx, st.Admin(), infra.Placement{Functions: fnNS, Sessions: o.namespace}, "namespaces.yaml", "rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := bindRole(o.namespace, fnNS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), fnNS, metav1.DeleteOptions{})
	})
	sa, err := st.CP.ServiceAccountConfig(ctx, fnNS, infra.ServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{t: t, env: o.env, ns: o.namespace, clock: &stacktest.Clock{}}
	b.faults = &faults{}
	sa.Wrap(func(rt http.RoundTripper) http.RoundTripper { b.faults.next = rt; return b.faults })
	sa.QPS, sa.Burst = 500, 1000
	b.cluster, err = kube.NewForConfig(kube.Config{
		Namespace: o.namespace, Env: o.env, MaxLifetime: 3 * o.lifetime, DeadlineGrace: o.grace,
		AnchorImage: "registry.k8s.io/pause:3.10", GuardianImage: "labkeep/guardian:test", CallTimeout: 10 * time.Second,
	}, sa)
	if err != nil {
		t.Fatal(err)
	}
	dsn := stacktest.CreateDatabase(t, st, o.env, 20)
	if b.store, err = pgstore.Open(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.store.Close)
	b.db = b.store.Pool()
	catalogYAML, err := infra.File("labs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	catalog, err := labsCatalog(catalogYAML)
	if err != nil {
		t.Fatal(err)
	}
	b.svc = &session.Service{
		Store: b.store, Cluster: b.cluster, Labs: catalog,
		Policy: lifetime.Policy{Lifetime: o.lifetime, MaxLifetime: 3 * o.lifetime},
		MaxVMs: o.maxVMs, Now: b.clock.Now, Log: stacktest.Discard(),
	}
	b.reaper = &reap.Reaper{
		Store: b.store, Cluster: b.cluster, Now: b.clock.Now, Log: stacktest.Discard(),
		Config: reap.Config{DryRun: o.dryRun, RunDeadline: o.deadline, Rules: reap.Rules{Env: o.env, ProvisionTimeout: 10 * time.Minute, ProvisionGrace: 2 * time.Minute}},
	}
	return b
}

// bindRole binds the shipped functions Role in the sessions namespace ns to
// the functions ServiceAccount of fnNS.
func bindRole(ns, fnNS string) error {
	cs, err := kubernetes.NewForConfig(st.Admin())
	if err != nil {
		return err
	}
	_, err = cs.RbacV1().RoleBindings(ns).Create(context.Background(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "labkeep-functions-" + fnNS},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: infra.ServiceAccount},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: infra.ServiceAccount, Namespace: fnNS}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func labsCatalog(data []byte) (*labs.Catalog, error) { return labs.Parse(data) }

// open opens a session of lab for student and waits until it is running.
func (b *backend) open(student, lab string) session.Session {
	b.t.Helper()
	ctx := context.Background()
	s, err := b.svc.Open(ctx, student, lab)
	if err != nil {
		b.t.Fatalf("open %s for %s: %v", lab, student, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := b.svc.Get(ctx, student, s.ID)
		if err != nil {
			b.t.Fatal(err)
		}
		if got.Status == session.StatusRunning {
			return got
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("session %s still %s after 30s", s.ID, got.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// run is one reaper run that must succeed.
func (b *backend) run() pgstore.ReapRun {
	b.t.Helper()
	r, err := b.reaper.RunOnce(context.Background(), reap.TriggerSchedule)
	if err != nil {
		b.t.Fatalf("reap run: %v", err)
	}
	return r
}

func (b *backend) status(id string) session.Status {
	b.t.Helper()
	s, err := b.store.Get(context.Background(), id)
	if err != nil {
		b.t.Fatal(err)
	}
	return s.Status
}

var gvrs = map[string]schema.GroupVersionResource{
	"VirtualMachine":         {Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"},
	"VirtualMachineInstance": {Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"},
	"Job":                    {Group: "batch", Version: "v1", Resource: "jobs"},
	"Secret":                 {Version: "v1", Resource: "secrets"},
	"Service":                {Version: "v1", Resource: "services"},
	"NetworkPolicy":          {Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"},
	"Pod":                    {Version: "v1", Resource: "pods"},
}

// objectsIn lists "Kind/name" of every object of labkeep's kinds in ns
// matching selector, sorted (admin view, for assertions), leaving out the
// anchor Jobs' Pods; objects being deleted are marked " (deleting)".
func objectsIn(t *testing.T, ns, selector string) []string {
	t.Helper()
	_, dyn := admin(t)
	var out []string
	for kind, gvr := range gvrs {
		list, err := dyn.Resource(gvr).Namespace(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatalf("list %s: %v", kind, err)
		}
		for _, o := range list.Items {
			// The anchor Job's Pod is the Job controller's, created
			// whenever it gets to it; it is not an object labkeep made.
			if _, anchorPod := o.GetLabels()[kube.LabelAnchorOf]; anchorPod {
				continue
			}
			name := kind + "/" + o.GetName()
			if o.GetDeletionTimestamp() != nil {
				// Still there: "gone" means absent, not merely deleting.
				name += " (deleting)"
			}
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// sessionObjects are the objects labelled with session id (VMIs carry the
// template's labels too).
func (b *backend) sessionObjects(id string) []string {
	return objectsIn(b.t, b.ns, kube.LabelSession+"="+id)
}

// waitGone waits until no object of session id is left.
func (b *backend) waitGone(id string, timeout time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := b.sessionObjects(id)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("objects of session %s left after %s: %v", id, timeout, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *backend) count(sql string, args ...any) int {
	b.t.Helper()
	var n int
	if err := b.db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}
