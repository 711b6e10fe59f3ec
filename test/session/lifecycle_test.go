package session_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
)

// Open → ready (virtsim) → the extend rules over time, at and
// past the cap → close; every object is gone and the row is closed.
func TestOpenReadyExtendClose(t *testing.T) {
	e := newEnv(t, stacktest.Options{})
	t0 := time.Now().UTC().Truncate(time.Microsecond)
	e.Clock.Set(t0)
	const student = "alice"
	tok := e.Token(student, "student")

	opened := e.Open(student, "linux-vm")
	t.Logf("openSession answered in %s", opened.Received.Sub(t0))
	if opened.Status != 201 {
		t.Fatalf("open = %d %s", opened.Status, opened.Body)
	}
	s := opened.Session
	if s.Status != "provisioning" || s.Student != student || s.Lab != "linux-vm" || s.Kind != "vm" {
		t.Errorf("opened session = %+v", s)
	}
	if !s.StartedAt.Equal(t0) || !s.ExpiresAt.Equal(t0.Add(time.Hour)) || !s.MaxExpiresAt.Equal(t0.Add(3*time.Hour)) {
		t.Errorf("window = %s %s %s, want start %s +60m +180m", s.StartedAt, s.ExpiresAt, s.MaxExpiresAt, t0)
	}
	if s.RemainingSeconds != 3600 || !s.ServerTime.Equal(t0) || s.Extendable {
		t.Errorf("remaining=%d serverTime=%s extendable=%v, want 3600, %s, false", s.RemainingSeconds, s.ServerTime, s.Extendable, t0)
	}

	// The objects exist, labelled and owned by the anchor.
	sel := "labkeep.io/session=" + s.ID
	got := e.Objects(sel)
	want := map[string]bool{
		"Job/lk-" + s.ID + "-anchor": true, "Secret/lk-" + s.ID + "-vm-cloudinit": true,
		"VirtualMachine/lk-" + s.ID + "-vm": true,
	}
	for _, o := range got {
		delete(want, o)
	}
	if len(want) > 0 {
		t.Errorf("missing objects %v; have %v", want, got)
	}
	anchor, err := e.Kube.BatchV1().Jobs(e.Namespace).Get(context.Background(), "lk-"+s.ID+"-anchor", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := anchor.Spec.ActiveDeadlineSeconds; d == nil || *d != int64((195*time.Minute).Seconds()) {
		t.Errorf("anchor activeDeadlineSeconds = %v, want 11700 (max lifetime + grace)", d)
	}
	secret, err := e.Kube.CoreV1().Secrets(e.Namespace).Get(context.Background(), "lk-"+s.ID+"-vm-cloudinit", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if refs := secret.OwnerReferences; len(refs) != 1 || refs[0].UID != anchor.UID {
		t.Errorf("secret owners = %+v, want the anchor %s", refs, anchor.UID)
	}
	if tok := string(secret.Data["grading-token"]); len(tok) != 64 {
		t.Errorf("grading token %q is not 256 bits of hex", tok)
	}
	if secret.Labels["labkeep.io/env"] != e.Env || secret.Labels["labkeep.io/student"] == "" || secret.Labels["labkeep.io/student"] == student {
		t.Errorf("secret labels = %v", secret.Labels)
	}

	e.Clock.Set(time.Time{}) // real time while the VM boots
	running := e.WaitRunning(student, 30*time.Second)
	t.Logf("time to ready: %s recorded (readyAt-startedAt, condition time has 1s resolution), %s from open response to running seen by 50ms polling; virtsim boot delay %s",
		running.ReadyAt.Sub(running.StartedAt), time.Since(opened.Received), bootDelay)
	if running.ReadyAt == nil || running.ReadyAt.Before(running.StartedAt) {
		t.Errorf("readyAt = %v", running.ReadyAt)
	}
	if n := running.Nodes; len(n) != 1 || !n[0].Ready || n[0].SSH.Host == "" || n[0].SSH.Port != 22 || n[0].Role != "vm" {
		t.Errorf("nodes = %+v", n)
	}
	if !running.Extendable {
		t.Error("running session not extendable")
	}

	// The extend rules as a table over (injected) time, one session.
	steps := []struct {
		name       string
		at         time.Duration // since t0
		wantStatus int
		wantCode   string
		wantExpiry time.Duration // since t0
		wantLeft   int64
		wantExtend bool
		// wantShown is the status getSession shows: expired as soon as
		// the time is up, although the reaper has not run.
		wantShown string
	}{
		{"early extend pushes to now+60m", 10 * time.Minute, 200, "", 70 * time.Minute, 3600, true, "running"},
		{"extend again later", 60 * time.Minute, 200, "", 120 * time.Minute, 3600, true, "running"},
		{"extend one second before expiry", 120*time.Minute - time.Second, 200, "", 180*time.Minute - time.Second, 3600, true, "running"},
		{"extend near the cap is clamped to it", 150 * time.Minute, 200, "", 180 * time.Minute, 1800, false, "running"},
		{"at the cap: extension_cap", 160 * time.Minute, 409, "extension_cap", 180 * time.Minute, 1200, false, "running"},
		{"one second before the end: still extension_cap", 180*time.Minute - time.Second, 409, "extension_cap", 180 * time.Minute, 1, false, "running"},
		{"at max lifetime: expired, not_running", 180 * time.Minute, 409, "not_running", 180 * time.Minute, 0, false, "expired"},
		{"past max lifetime: not_running", 200 * time.Minute, 409, "not_running", 180 * time.Minute, 0, false, "expired"},
	}
	for _, step := range steps {
		e.Clock.Set(t0.Add(step.at))
		r := e.Do("POST", "/extendSession", tok, "", "")
		if r.Status != step.wantStatus || r.Code != step.wantCode {
			t.Errorf("%s: extend = %d %q (%s), want %d %q", step.name, r.Status, r.Code, r.Message, step.wantStatus, step.wantCode)
			continue
		}
		if !r.Session.ExpiresAt.Equal(t0.Add(step.wantExpiry)) {
			t.Errorf("%s: expiresAt = +%s, want +%s", step.name, r.Session.ExpiresAt.Sub(t0), step.wantExpiry)
		}
		g := e.Do("GET", "/getSession", tok, "", "")
		if g.Session.Status != step.wantShown {
			t.Errorf("%s: getSession status %q, want %q", step.name, g.Session.Status, step.wantShown)
		}
		if g.Session.RemainingSeconds != step.wantLeft || g.Session.Extendable != step.wantExtend || !g.Session.ServerTime.Equal(t0.Add(step.at)) {
			t.Errorf("%s: get remaining=%d extendable=%v serverTime=+%s, want %d %v +%s", step.name,
				g.Session.RemainingSeconds, g.Session.Extendable, g.Session.ServerTime.Sub(t0), step.wantLeft, step.wantExtend, step.at)
		}
	}
	// Closing works on a session the reaper has not yet collected: its
	// resources go, and it is recorded expired — its time ran out, the
	// student did not end it early — as getSession already showed.
	closed := e.Do("POST", "/closeSession", tok, "", "")
	if closed.Status != 200 || closed.Session.Status != "expired" {
		t.Fatalf("close after expiry = %d %s", closed.Status, closed.Body)
	}
	e.WaitNoObjects()
	if got := e.Rows(); len(got) != 1 || !strings.Contains(got[0], " expired ") {
		t.Errorf("rows after close = %v", got)
	}
	if n := e.Count(`SELECT count(*) FROM sessions WHERE status = 'expired' AND failure_reason LIKE 'expired at %; closed by student alice after its expiry'`); n != 1 {
		t.Errorf("expired row's reason does not say who closed it")
	}
	if r := e.Do("POST", "/closeSession", tok, "", ""); r.Status != 404 || r.Code != "no_session" {
		t.Errorf("second close = %d %s", r.Status, r.Body)
	}
	if r := e.Do("GET", "/getSession", tok, "", ""); r.Status != 200 || r.Session.Status != "expired" || r.Session.RemainingSeconds != 0 {
		t.Errorf("get after close = %d %s", r.Status, r.Body)
	}
	// Ended frees the student to open again at once; closing before the
	// expiry records closed.
	e.Clock.Set(time.Time{})
	again := e.Opened(student, "linux-vm")
	if r := e.Do("POST", "/closeSession", tok, "", ""); r.Status != 200 || r.Session.Status != "closed" {
		t.Errorf("close before expiry = %d %s", r.Status, r.Body)
	}
	if n := e.Count(`SELECT count(*) FROM sessions WHERE id = $1 AND status = 'closed' AND failure_reason = 'closed by student alice'`, again.ID); n != 1 {
		t.Errorf("session closed before its expiry is not recorded closed")
	}
	e.WaitNoObjects()
}

// A student whose session expired can open a new lab at once: the expired
// one is reclaimed (resources deleted, then the row marked expired) without
// waiting for the reaper.
func TestOpenAfterExpiryReclaimsTheOldSession(t *testing.T) {
	e := newEnv(t, stacktest.Options{})
	first := e.Opened("erin", "k8s-cluster")
	e.WaitRunning("erin", 30*time.Second)
	e.Clock.Set(first.ExpiresAt.Add(-time.Second))
	if r := e.Open("erin", "linux-vm"); r.Status != 409 || r.Code != "session_exists" {
		t.Fatalf("open one second before expiry = %d %s", r.Status, r.Body)
	}
	e.Clock.Set(first.ExpiresAt)
	second := e.Open("erin", "linux-vm")
	if second.Status != 201 || second.Session.ID == first.ID {
		t.Fatalf("open at expiry = %d %s", second.Status, second.Body)
	}
	e.WaitNoneMatching(kube.LabelSession + "=" + first.ID)
	if n := e.Count(`SELECT count(*) FROM sessions WHERE id = $1 AND status = 'expired' AND finished_at IS NOT NULL`, first.ID); n != 1 {
		t.Errorf("the old row is not expired")
	}
}
