package session_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/shared/session"
)

// 50 students open at once with MAX 8: exactly 8 live, 42 get
// 503 no_capacity with Retry-After, nothing left behind — five times.
// There is no ResourceQuota in the namespace, so every refusal must come
// from labkeep's own count under the capacity lock (each refused row's
// stored reason says so): without the lock, concurrent opens all see room
// and more than 8 VMs get created.
func TestFiftyConcurrentOpensWithEightSlots(t *testing.T) {
	e := newEnv(t, envOptions{maxVMs: 8, quota: false})
	if q, err := e.kube.CoreV1().ResourceQuotas(e.ns).List(context.Background(), metav1.ListOptions{}); err != nil || len(q.Items) != 0 {
		t.Fatalf("sessions namespace has quotas %v (%v); this test must run without the backstop", q, err)
	}
	const students, slots, reps = 50, 8, 5
	for rep := 1; rep <= reps; rep++ {
		var wg sync.WaitGroup
		results := make([]response, students)
		start := make(chan struct{})
		for i := range students {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i] = e.open(fmt.Sprintf("student-%02d", i), "linux-vm")
			}()
		}
		began := time.Now()
		close(start)
		wg.Wait()
		took := time.Since(began)

		var opened []string
		counts := map[string]int{}
		for i, r := range results {
			counts[fmt.Sprintf("%d %s", r.status, r.code)]++
			switch r.status {
			case 201:
				opened = append(opened, fmt.Sprintf("student-%02d", i))
			case 503:
				if r.code != "no_capacity" || r.header.Get("Retry-After") != "20" {
					t.Errorf("rep %d: 503 with code %q Retry-After %q", rep, r.code, r.header.Get("Retry-After"))
				}
				noInternals(t, "no_capacity", r)
			}
		}
		live := e.count(`SELECT count(*) FROM sessions WHERE status IN ('provisioning','running')`)
		vms := len(e.objectsOfKind("VirtualMachine"))
		t.Logf("rep %d: %v in %s; live rows %d, VMs %d", rep, counts, took.Round(time.Millisecond), live, vms)
		if len(opened) != slots || counts["503 no_capacity"] != students-slots || live != slots || vms != slots {
			t.Fatalf("rep %d: %d opened, %d no_capacity, %d live rows, %d VMs; want %d, %d, %d, %d",
				rep, len(opened), counts["503 no_capacity"], live, vms, slots, students-slots, slots, slots)
		}
		// Every refusal so far is labkeep's own count under its lock.
		byCount := e.count(`SELECT count(*) FROM sessions WHERE status = 'failed' AND failure_reason LIKE 'no\_capacity: 8 of 8 VMs in use, lab linux-vm needs 1'`)
		failed := e.count(`SELECT count(*) FROM sessions WHERE status = 'failed'`)
		if byCount != rep*(students-slots) || failed != byCount {
			t.Fatalf("rep %d: %d failed rows, %d refused by labkeep's count; want %d, all by the count", rep, failed, byCount, rep*(students-slots))
		}
		// Nothing of the 42 refused sessions exists: every labkeep object
		// belongs to one of the 8 live sessions.
		liveIDs := e.liveIDs()
		for _, o := range e.labelledObjects() {
			if !liveIDs[o.session] {
				t.Errorf("rep %d: leftover %s of non-live session %s", rep, o.name, o.session)
			}
		}
		for _, student := range opened {
			if r := e.do("POST", "/closeSession", e.token(student, "student"), "", ""); r.status != 200 {
				t.Fatalf("close %s = %d %s", student, r.status, r.body)
			}
		}
		e.waitNoObjects(30 * time.Second)
	}
}

// The ResourceQuota is the backstop: with the app's own limit set high, the
// quota refuses the VM beyond it, the open gets 503 no_capacity, the row is
// failed and nothing is left behind.
func TestQuotaRefusalIsNoCapacity(t *testing.T) {
	e := newEnv(t, envOptions{maxVMs: 100})
	e.limitVMs(2)
	for _, s := range []string{"q1", "q2"} {
		if r := e.open(s, "linux-vm"); r.status != 201 {
			t.Fatalf("open %s = %d %s", s, r.status, r.body)
		}
	}
	r := e.open("q3", "linux-vm")
	if r.status != 503 || r.code != "no_capacity" || r.header.Get("Retry-After") == "" {
		t.Fatalf("third open = %d %s", r.status, r.body)
	}
	t.Logf("quota refusal as the student reads it: %s", r.message)
	noInternals(t, "quota refusal", r)
	if r.session.Status != "failed" || r.session.FailureReason != session.PublicReasonNoCapacity {
		t.Errorf("refused session = %+v, want failed with %q", r.session, session.PublicReasonNoCapacity)
	}
	// The quota's own words are kept for the log and admins.
	if got := e.count(`SELECT count(*) FROM sessions WHERE student = 'q3' AND status = 'failed' AND failure_reason LIKE 'no\_capacity: %exceeded quota%'`); got != 1 {
		t.Errorf("q3 failed rows refused by the quota = %d, want 1", got)
	}
	admin := e.do("GET", "/getSession?student=q3", e.token("root", "admin"), "", "")
	if !strings.Contains(admin.session.FailureReason, "exceeded quota") {
		t.Errorf("admin reads reason %q, want the quota's refusal", admin.session.FailureReason)
	}
	waitFor(t, 20*time.Second, "no leftovers of the refused session", func() bool {
		for _, o := range e.labelledObjects() {
			if o.session == r.session.ID {
				return false
			}
		}
		return true
	})
}

// One student double-opening concurrently gets one session.
func TestConcurrentDoubleOpenBySameStudent(t *testing.T) {
	e := newEnv(t, envOptions{})
	const tries = 10
	results := make([]response, tries)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range tries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = e.open("bob", "k8s-cluster")
		}()
	}
	close(start)
	wg.Wait()
	var created []string
	for _, r := range results {
		switch {
		case r.status == 201:
			created = append(created, r.session.ID)
		case r.status == 409 && r.code == "session_exists":
		default:
			t.Errorf("open = %d %s", r.status, r.body)
		}
	}
	if len(created) != 1 {
		t.Fatalf("%d sessions created, want 1", len(created))
	}
	for _, r := range results {
		if r.status == 409 && r.session.ID != created[0] {
			t.Errorf("409 names session %q, want the live %q", r.session.ID, created[0])
		}
	}
	if n := e.count(`SELECT count(*) FROM sessions WHERE student = 'bob'`); n != 1 {
		t.Errorf("bob has %d rows, want 1", n)
	}
	if vms := e.objectsOfKind("VirtualMachine"); len(vms) != 3 {
		t.Errorf("VMs = %v, want the 3 of one k8s-cluster session", vms)
	}
	s := e.waitRunning("bob", 30*time.Second)
	if len(s.Nodes) != 3 {
		t.Errorf("nodes = %+v", s.Nodes)
	}
}

type labelled struct{ name, session string }

// labelledObjects lists objects carrying this env's labkeep.io/env label.
func (e *env) labelledObjects() []labelled {
	e.t.Helper()
	var out []labelled
	for kind, gvr := range gvrs {
		list, err := e.dyn.Resource(gvr).Namespace(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "labkeep.io/env=" + e.name})
		if err != nil {
			e.t.Fatal(err)
		}
		for _, o := range list.Items {
			out = append(out, labelled{kind + "/" + o.GetName(), o.GetLabels()["labkeep.io/session"]})
		}
	}
	return out
}

func (e *env) objectsOfKind(kind string) []string {
	e.t.Helper()
	list, err := e.dyn.Resource(gvrs[kind]).Namespace(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, o := range list.Items {
		out = append(out, o.GetName())
	}
	return out
}

func (e *env) liveIDs() map[string]bool {
	e.t.Helper()
	rows, err := e.db.Query(context.Background(), `SELECT id::text FROM sessions WHERE status IN ('provisioning','running')`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	ids := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		ids[id] = true
	}
	return ids
}

func waitFor(t testing.TB, timeout time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// If the functions cannot list VMs (here: RBAC no longer grants it), opens
// are not all refused: the count is skipped and the ResourceQuota still
// caps the namespace.
func TestUncountableClusterFallsBackToQuota(t *testing.T) {
	e := newEnv(t, envOptions{maxVMs: 8})
	ctx := context.Background()
	role, err := e.kube.RbacV1().Roles(e.ns).Get(ctx, "labkeep-functions", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range role.Rules {
		if len(r.Resources) == 1 && r.Resources[0] == "virtualmachines" {
			role.Rules[i].Verbs = []string{"create", "get", "delete"} // no list
		}
	}
	if _, err := e.kube.RbacV1().Roles(e.ns).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "list refused", func() bool {
		_, err := e.app.Cluster.CountVMs(ctx)
		return err != nil
	})
	e.limitVMs(1)
	if r := e.open("u1", "linux-vm"); r.status != 201 {
		t.Fatalf("open without a VM count = %d %s", r.status, r.body)
	}
	r := e.open("u2", "linux-vm")
	if r.status != 503 || r.code != "no_capacity" {
		t.Fatalf("open beyond the quota = %d %s", r.status, r.body)
	}
	noInternals(t, "quota refusal", r)
	if n := e.count(`SELECT count(*) FROM sessions WHERE student = 'u2' AND status = 'failed' AND failure_reason LIKE 'no\_capacity: %exceeded quota%'`); n != 1 {
		t.Errorf("u2's refusal is not the quota's (%d rows)", n)
	}
	waitFor(t, 20*time.Second, "refused session cleaned up", func() bool {
		for _, o := range e.labelledObjects() {
			if o.session == r.session.ID {
				return false
			}
		}
		return true
	})
}

// limitVMs adds a ResourceQuota of n VMs to the sessions namespace and
// waits until the quota controller has computed its usage (until then the
// API server cannot enforce it).
func (e *env) limitVMs(n int) {
	e.t.Helper()
	ctx := context.Background()
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "test-vm-limit"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/virtualmachines.kubevirt.io": *resource.NewQuantity(int64(n), resource.DecimalSI)}},
	}
	if _, err := e.kube.CoreV1().ResourceQuotas(e.ns).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	waitFor(e.t, 30*time.Second, "quota status", func() bool {
		q, err := e.kube.CoreV1().ResourceQuotas(e.ns).Get(ctx, quota.Name, metav1.GetOptions{})
		return err == nil && len(q.Status.Hard) > 0
	})
}
