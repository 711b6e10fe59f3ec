package session_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
