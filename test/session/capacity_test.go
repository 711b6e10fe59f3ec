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

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/session"
)

// 50 students open at once with MAX 8: exactly 8 live, 42 get
// 503 no_capacity with Retry-After, nothing left behind — five times.
// There is no ResourceQuota in the namespace, so every refusal must come
// from labkeep's own count under the capacity lock (each refused row's
// stored reason says so): without the lock, concurrent opens all see room
// and more than 8 VMs get created.
func TestFiftyConcurrentOpensWithEightSlots(t *testing.T) {
	e := newEnv(t, stacktest.Options{MaxVMs: 8, Quota: false})
	if q, err := e.Kube.CoreV1().ResourceQuotas(e.Namespace).List(context.Background(), metav1.ListOptions{}); err != nil || len(q.Items) != 0 {
		t.Fatalf("sessions namespace has quotas %v (%v); this test must run without the backstop", q, err)
	}
	const students, slots, reps = 50, 8, 5
	for rep := 1; rep <= reps; rep++ {
		began := time.Now()
		results := atOnce(students, func(i int) stacktest.Response {
			return e.Open(fmt.Sprintf("student-%02d", i), "linux-vm")
		})
		took := time.Since(began)

		var opened []string
		counts := map[string]int{}
		for i, r := range results {
			counts[fmt.Sprintf("%d %s", r.Status, r.Code)]++
			switch r.Status {
			case 201:
				opened = append(opened, fmt.Sprintf("student-%02d", i))
			case 503:
				if r.Code != "no_capacity" || r.Header.Get("Retry-After") != retryAfter(e) {
					t.Errorf("rep %d: 503 with code %q Retry-After %q", rep, r.Code, r.Header.Get("Retry-After"))
				}
				noInternals(t, "no_capacity", r)
			}
		}
		live := e.Count(`SELECT count(*) FROM sessions WHERE status IN ('provisioning','running')`)
		vms := len(e.List(stacktest.Listing{Kinds: []string{"VirtualMachine"}}))
		t.Logf("rep %d: %v in %s; live rows %d, VMs %d", rep, counts, took.Round(time.Millisecond), live, vms)
		if len(opened) != slots || counts["503 no_capacity"] != students-slots || live != slots || vms != slots {
			t.Fatalf("rep %d: %d opened, %d no_capacity, %d live rows, %d VMs; want %d, %d, %d, %d",
				rep, len(opened), counts["503 no_capacity"], live, vms, slots, students-slots, slots, slots)
		}
		// Every refusal so far is labkeep's own count under its lock.
		byCount := e.Count(`SELECT count(*) FROM sessions WHERE status = 'failed' AND end_kind = 'no_capacity' AND end_actor = 'open' AND failure_reason LIKE 'no\_capacity: 8 of 8 VMs in use, lab linux-vm needs 1'`)
		failed := e.Count(`SELECT count(*) FROM sessions WHERE status = 'failed'`)
		if byCount != rep*(students-slots) || failed != byCount {
			t.Fatalf("rep %d: %d failed rows, %d refused by labkeep's count; want %d, all by the count", rep, failed, byCount, rep*(students-slots))
		}
		// Nothing of the 42 refused sessions exists: every labkeep object
		// belongs to one of the 8 live sessions.
		liveIDs := e.LiveIDs()
		for _, o := range labelled(e) {
			if !liveIDs[o.Session] {
				t.Errorf("rep %d: leftover %s of non-live session %s", rep, o, o.Session)
			}
		}
		for _, student := range opened {
			if r := e.Close(student); r.Status != 200 {
				t.Fatalf("close %s = %d %s", student, r.Status, r.Body)
			}
		}
		e.WaitNoObjects()
	}
}

// The ResourceQuota is the backstop: with the app's own limit set high, the
// quota refuses the VM beyond it, the open gets 503 no_capacity, the row is
// failed and nothing is left behind.
func TestQuotaRefusalIsNoCapacity(t *testing.T) {
	e := newEnv(t, stacktest.Options{MaxVMs: 100})
	limitVMs(t, e, 2)
	for _, s := range []string{"q1", "q2"} {
		e.Opened(s, "linux-vm")
	}
	waitQuotaUsed(t, e, 2)
	r := e.Open("q3", "linux-vm")
	if r.Status != 503 || r.Code != "no_capacity" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("third open = %d %s", r.Status, r.Body)
	}
	t.Logf("quota refusal as the student reads it: %s", r.Message)
	noInternals(t, "quota refusal", r)
	if want := session.Sentence(session.EndNoCapacity); r.Session.Status != "failed" || r.Session.FailureReason != want {
		t.Errorf("refused session = %+v, want failed with %q", r.Session, want)
	}
	// The quota's own words are kept for the log and admins.
	if got := e.Count(`SELECT count(*) FROM sessions WHERE student = 'q3' AND status = 'failed' AND failure_reason LIKE 'no\_capacity: %exceeded quota%'`); got != 1 {
		t.Errorf("q3 failed rows refused by the quota = %d, want 1", got)
	}
	admin := e.Do("GET", "/getSession?student=q3", e.Token("root", "admin"), "", "")
	if !strings.Contains(admin.Session.FailureReason, "exceeded quota") {
		t.Errorf("admin reads reason %q, want the quota's refusal", admin.Session.FailureReason)
	}
	waitNoneOf(t, e, r.Session.ID)
}

// One student double-opening concurrently gets one session.
func TestConcurrentDoubleOpenBySameStudent(t *testing.T) {
	e := newEnv(t, stacktest.Options{})
	const tries = 10
	results := atOnce(tries, func(int) stacktest.Response { return e.Open("bob", "k8s-cluster") })
	var created []string
	for _, r := range results {
		switch {
		case r.Status == 201:
			created = append(created, r.Session.ID)
		case r.Status == 409 && r.Code == "session_exists":
		default:
			t.Errorf("open = %d %s", r.Status, r.Body)
		}
	}
	if len(created) != 1 {
		t.Fatalf("%d sessions created, want 1", len(created))
	}
	for _, r := range results {
		if r.Status == 409 && r.Session.ID != created[0] {
			t.Errorf("409 names session %q, want the live %q", r.Session.ID, created[0])
		}
	}
	if n := e.Count(`SELECT count(*) FROM sessions WHERE student = 'bob'`); n != 1 {
		t.Errorf("bob has %d rows, want 1", n)
	}
	if vms := stacktest.Names(e.List(stacktest.Listing{Kinds: []string{"VirtualMachine"}})); len(vms) != 3 {
		t.Errorf("VMs = %v, want the 3 of one k8s-cluster session", vms)
	}
	s := e.WaitRunning("bob", 30*time.Second)
	if len(s.Nodes) != 3 {
		t.Errorf("nodes = %+v", s.Nodes)
	}
}

// atOnce calls call(0) … call(n-1) on n goroutines released together, as
// many students clicking at the same moment, and returns the answers in
// order.
func atOnce(n int, call func(i int) stacktest.Response) []stacktest.Response {
	results := make([]stacktest.Response, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = call(i)
		}()
	}
	close(start)
	wg.Wait()
	return results
}

// labelled lists the objects carrying e's labkeep.io/env label.
func labelled(e *stacktest.Deployment) []stacktest.Object {
	return e.List(stacktest.Listing{Selector: kube.LabelEnv + "=" + e.Env})
}

// waitNoneOf waits until no object of e's environment belongs to session
// id.
func waitNoneOf(t *testing.T, e *stacktest.Deployment, id string) {
	t.Helper()
	e.WaitNoneMatching(kube.LabelEnv + "=" + e.Env + "," + kube.LabelSession + "=" + id)
}

// If the functions cannot list VMs (here: RBAC no longer grants it), opens
// are not all refused: the count is skipped and the ResourceQuota still
// caps the namespace.
func TestUncountableClusterFallsBackToQuota(t *testing.T) {
	e := newEnv(t, stacktest.Options{MaxVMs: 8})
	ctx := context.Background()
	role, err := e.Kube.RbacV1().Roles(e.Namespace).Get(ctx, "labkeep-functions", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range role.Rules {
		if len(r.Resources) == 1 && r.Resources[0] == "virtualmachines" {
			role.Rules[i].Verbs = []string{"create", "get", "delete"} // no list
		}
	}
	if _, err := e.Kube.RbacV1().Roles(e.Namespace).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, 10*time.Second, func() (bool, string) {
		_, err := e.App.Cluster.CountVMs(ctx)
		return err != nil, "the functions may still list VMs"
	})
	limitVMs(t, e, 1)
	e.Opened("u1", "linux-vm") // without a VM count
	waitQuotaUsed(t, e, 1)
	r := e.Open("u2", "linux-vm")
	if r.Status != 503 || r.Code != "no_capacity" {
		t.Fatalf("open beyond the quota = %d %s", r.Status, r.Body)
	}
	noInternals(t, "quota refusal", r)
	if n := e.Count(`SELECT count(*) FROM sessions WHERE student = 'u2' AND status = 'failed' AND failure_reason LIKE 'no\_capacity: %exceeded quota%'`); n != 1 {
		t.Errorf("u2's refusal is not the quota's (%d rows)", n)
	}
	waitNoneOf(t, e, r.Session.ID)
}

// vmLimit is the ResourceQuota limitVMs adds, over vmCount, the number of
// VirtualMachines.
const (
	vmLimit = "test-vm-limit"
	vmCount = corev1.ResourceName("count/virtualmachines.kubevirt.io")
)

// waitQuotaUsed waits until the VM quota of limitVMs counts n VMs. A VM
// created before the API server's quota admission saw the new quota is
// counted only when the quota controller next recomputes the usage; until
// then one more VM would be admitted, so a refusal beyond the quota is
// asserted only once the quota counts what exists.
func waitQuotaUsed(t *testing.T, e *stacktest.Deployment, n int64) {
	t.Helper()
	ctx := context.Background()
	stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
		q, err := e.Kube.CoreV1().ResourceQuotas(e.Namespace).Get(ctx, vmLimit, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		used := q.Status.Used[vmCount]
		return used.Value() == n, fmt.Sprintf("the quota counts %s VMs, want %d", used.String(), n)
	})
}

// limitVMs adds a ResourceQuota of n VMs to the sessions namespace and
// waits until the quota controller has computed its usage (until then the
// API server cannot enforce it).
func limitVMs(t *testing.T, e *stacktest.Deployment, n int) {
	t.Helper()
	ctx := context.Background()
	quota := &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: vmLimit},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{vmCount: *resource.NewQuantity(int64(n), resource.DecimalSI)}},
	}
	if _, err := e.Kube.CoreV1().ResourceQuotas(e.Namespace).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
		q, err := e.Kube.CoreV1().ResourceQuotas(e.Namespace).Get(ctx, quota.Name, metav1.GetOptions{})
		return err == nil && len(q.Status.Hard) > 0, fmt.Sprintf("quota %s has no status yet (%v)", quota.Name, err)
	})
}
