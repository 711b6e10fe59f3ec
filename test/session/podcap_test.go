package session_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"labkeep/infra"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
)

// A class opening the shell Pod lab at once cannot fill the nodes: 30
// students with LABKEEP_MAX_CONCURRENT_PODS=5 get exactly 5 workspace
// Pods, 25 get 503 no_capacity, every refusal by labkeep's own count
// under the capacity lock (no ResourceQuota in the namespace), and
// nothing of a refused session is left behind.
func TestThirtyShellOpensWithFivePodSlots(t *testing.T) {
	e := newEnv(t, stacktest.Options{MaxPods: 5, Quota: false})
	if q, err := e.Kube.CoreV1().ResourceQuotas(e.Namespace).List(context.Background(), metav1.ListOptions{}); err != nil || len(q.Items) != 0 {
		t.Fatalf("sessions namespace has quotas %v (%v); this test must run without the backstop", q, err)
	}
	const students, slots = 30, 5
	results := atOnce(students, func(i int) stacktest.Response {
		return e.Open(fmt.Sprintf("shell-%02d", i), "shell")
	})
	counts := map[string]int{}
	var opened []string
	var firstID string
	for i, r := range results {
		counts[fmt.Sprintf("%d %s", r.Status, r.Code)]++
		switch r.Status {
		case 201:
			opened = append(opened, fmt.Sprintf("shell-%02d", i))
			if firstID == "" {
				firstID = r.Session.ID
			}
		case 503:
			if r.Code != "no_capacity" || r.Header.Get("Retry-After") != retryAfter(e) {
				t.Errorf("503 with code %q Retry-After %q", r.Code, r.Header.Get("Retry-After"))
			}
			noInternals(t, "no_capacity", r)
		}
	}
	live := e.Count(`SELECT count(*) FROM sessions WHERE status IN ('provisioning','running')`)
	pods := len(e.List(stacktest.Listing{Kinds: []string{"Pod"}, Selector: kube.LabelEnv + "=" + e.Env, LeaveOutAnchorPods: true}))
	byCount := e.Count(`SELECT count(*) FROM sessions WHERE status = 'failed' AND end_kind = 'no_capacity' AND end_actor = 'open' AND failure_reason LIKE 'no\_capacity: 5 of 5 workspace Pods in use, lab shell needs 1'`)
	t.Logf("%v; live rows %d, workspace Pods %d, refused by the count %d", counts, live, pods, byCount)
	if len(opened) != slots || counts["503 no_capacity"] != students-slots || live != slots || pods != slots || byCount != students-slots {
		t.Fatalf("%d opened, %d no_capacity, %d live rows, %d workspace Pods, %d refused by the count; want %d, %d, %d, %d, %d",
			len(opened), counts["503 no_capacity"], live, pods, byCount, slots, students-slots, slots, slots, students-slots)
	}
	liveIDs := e.LiveIDs()
	for _, o := range labelled(e) {
		if !liveIDs[o.Session] {
			t.Errorf("leftover %s of non-live session %s", o, o.Session)
		}
	}
	// A freed slot is a slot again.
	if r := e.Close(opened[0]); r.Status != 200 {
		t.Fatalf("close %s = %d %s", opened[0], r.Status, r.Body)
	}
	waitNoneOf(t, e, firstID)
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := e.Open("shell-late", "shell")
		if r.Status == 201 {
			break
		}
		if r.Status != 503 || time.Now().After(deadline) {
			t.Fatalf("open after a close = %d %s", r.Status, r.Body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// The labkeep-workspaces quota of infra/base/resourcequota.yaml (here with 2
// pods) is the backstop for workspace Pods only: with labkeep's own caps
// set high, the third shell is refused by the quota, while VM labs — whose
// anchor Pods and virt-launcher Pods have no deadline — still open.
func TestWorkspaceQuotaCountsWorkspacePodsOnly(t *testing.T) {
	e := newEnv(t, stacktest.Options{MaxPods: 100, MaxVMs: 100, Quota: false})
	objs, err := infra.Objects(infra.Placement{Sessions: e.Namespace}, "resourcequota.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var quota corev1.ResourceQuota
	for _, o := range objs {
		if o.GetName() == infra.PodQuota {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &quota); err != nil {
				t.Fatal(err)
			}
		}
	}
	if quota.Name == "" {
		t.Fatalf("infra/base/resourcequota.yaml has no %s", infra.PodQuota)
	}
	quota.Spec.Hard[corev1.ResourcePods] = *resource.NewQuantity(2, resource.DecimalSI)
	ctx := context.Background()
	if _, err := e.Kube.CoreV1().ResourceQuotas(e.Namespace).Create(ctx, &quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
		q, err := e.Kube.CoreV1().ResourceQuotas(e.Namespace).Get(ctx, quota.Name, metav1.GetOptions{})
		return err == nil && len(q.Status.Hard) > 0, fmt.Sprintf("quota %s has no status yet (%v)", quota.Name, err)
	})
	for _, s := range []string{"w1", "w2"} {
		e.Opened(s, "shell")
	}
	r := e.Open("w3", "shell")
	if r.Status != 503 || r.Code != "no_capacity" {
		t.Fatalf("third shell = %d %s, want 503 no_capacity from the quota", r.Status, r.Body)
	}
	if got := e.Count(`SELECT count(*) FROM sessions WHERE student = 'w3' AND status = 'failed' AND failure_reason LIKE 'no\_capacity: %exceeded quota%'`); got != 1 {
		t.Errorf("w3 failed rows refused by the quota = %d, want 1", got)
	}
	waitNoneOf(t, e, r.Session.ID)
	for _, s := range []string{"v1", "v2", "v3"} {
		e.Opened(s, "linux-vm")
	}
	q, err := e.Kube.CoreV1().ResourceQuotas(e.Namespace).Get(ctx, quota.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	used := q.Status.Used[corev1.ResourcePods]
	t.Logf("with 2 shells and 3 VM sessions open the quota counts %s pods", used.String())
	if used.Value() > 2 {
		t.Errorf("quota counts %s pods, want at most the 2 workspace Pods", used.String())
	}
}
