package session_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// holdCapacity takes the capacity lock the functions share (as another
// open in flight would) and returns its release.
func holdCapacity(t *testing.T, e *stacktest.Deployment) func() {
	t.Helper()
	unlock, err := e.App.Store.LockCapacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock) // unlock is idempotent
	return unlock
}

// openQueued starts an open for student while the capacity lock is held
// and returns, once its row is written and it waits for the lock, the
// row's id and a channel with the open's answer.
func openQueued(t *testing.T, e *stacktest.Deployment, student, lab string) (string, <-chan stacktest.Response) {
	t.Helper()
	answer := make(chan stacktest.Response, 1)
	go func() { answer <- e.Open(student, lab) }()
	var id string
	stacktest.Eventually(t, 20*time.Second, func() (bool, string) {
		err := e.DB.QueryRow(context.Background(),
			`SELECT id::text FROM sessions WHERE student = $1 AND status = 'provisioning'`, student).Scan(&id)
		return err == nil, fmt.Sprintf("no provisioning row of %s (%v)", student, err)
	})
	// The row is written before the lock is requested: wait until the
	// open's session waits on an advisory lock in this database (nothing
	// can be created while we hold it).
	stacktest.Eventually(t, 20*time.Second, func() (bool, string) {
		n := e.Count(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
		return n > 0, "the open is not waiting for the capacity lock"
	})
	select {
	case r := <-answer:
		t.Fatalf("open answered %d %s while the capacity lock was held", r.Status, r.Body)
	default:
	}
	return id, answer
}

// An open queued for capacity whose row is ended meanwhile — the student
// closes it, or the reaper fails it as a ghost (a provisioning row without
// VMs past the grace) — creates nothing, answers 502 provisioning_failed
// (never 201 for a dead row) with a fixed message, and the row keeps the
// ender's status.
func TestSessionEndedWhileQueuedForCapacity(t *testing.T) {
	tests := []struct {
		name       string
		end        func(t *testing.T, e *stacktest.Deployment, student, id string)
		wantStatus string
	}{
		{"student closes it", func(t *testing.T, e *stacktest.Deployment, student, _ string) {
			r := e.Close(student)
			if r.Status != 200 || r.Session.Status != "closed" {
				t.Fatalf("close while queued = %d %s", r.Status, r.Body)
			}
		}, "closed"},
		{"reaper fails it as a ghost", func(t *testing.T, e *stacktest.Deployment, _, id string) {
			// How the reaper ends a ghost: the one End operation, through
			// the same store and cluster.
			ghost := session.Ending{
				Reason:              session.EndReason{Kind: session.EndGhost, Actor: session.ActorReaper, Detail: "VirtualMachine " + session.NodeName(id, "vm") + " no longer exists"},
				EvenIfTeardownFails: true,
			}
			if _, ended, err := session.End(context.Background(), e.App.Store, e.App.Cluster, id, ghost, time.Now()); err != nil || !ended {
				t.Fatalf("ending the queued session as a ghost: ended=%v err=%v", ended, err)
			}
		}, "failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, stacktest.Options{})
			release := holdCapacity(t, e)
			id, answer := openQueued(t, e, "dave", "k8s-cluster")
			tc.end(t, e, "dave", id)
			release()
			var r stacktest.Response
			select {
			case r = <-answer:
			case <-time.After(60 * time.Second):
				t.Fatal("open did not answer after the lock was released")
			}
			if r.Status != 502 || r.Code != "provisioning_failed" || !strings.Contains(r.Message, "ended") {
				t.Errorf("open = %d %q %q, want 502 provisioning_failed saying the session was ended", r.Status, r.Code, r.Message)
			}
			if r.Session.ID != id || r.Session.Status != tc.wantStatus {
				t.Errorf("answer's session = %s %s, want %s %s", r.Session.ID, r.Session.Status, id, tc.wantStatus)
			}
			if got := e.Rows(); len(got) != 1 || !strings.Contains(got[0], id+" dave "+tc.wantStatus+" ") {
				t.Errorf("rows = %v, want the one %s row", got, tc.wantStatus)
			}
			if left := e.Objects(""); len(left) != 0 {
				t.Errorf("objects left: %v", left)
			}
			// The student is free to open again at once.
			if again := e.Open("dave", "linux-vm"); again.Status != 201 {
				t.Errorf("open again = %d %s", again.Status, again.Body)
			}
		})
	}
}

// The wait for the capacity lock is bounded by LABKEEP_CAPACITY_WAIT: an
// open queued longer gets 503 no_capacity with Retry-After, its row ends
// failed, nothing is created, and the student may retry.
func TestCapacityWaitExpiryIsNoCapacity(t *testing.T) {
	e := newEnv(t, stacktest.Options{CapacityWait: 2 * time.Second})
	release := holdCapacity(t, e)
	began := time.Now()
	r := e.Open("fay", "linux-vm")
	took := time.Since(began)
	if r.Status != 503 || r.Code != "no_capacity" || r.Header.Get("Retry-After") != retryAfter(e) {
		t.Fatalf("open while the lock is held = %d %s (Retry-After %q)", r.Status, r.Body, r.Header.Get("Retry-After"))
	}
	if took < 2*time.Second {
		t.Errorf("answered after %s, before the 2s capacity wait", took)
	}
	t.Logf("no_capacity after %s of waiting: %s", took.Round(time.Millisecond), r.Message)
	if n := e.Count(`SELECT count(*) FROM sessions WHERE student = 'fay' AND status = 'failed' AND failure_reason LIKE 'no_capacity: waited 2s for the capacity lock%'`); n != 1 {
		t.Errorf("fay's failed rows with the wait as reason = %d, want 1", n)
	}
	if left := e.Objects(""); len(left) != 0 {
		t.Errorf("objects left: %v", left)
	}
	release()
	if again := e.Open("fay", "linux-vm"); again.Status != 201 {
		t.Errorf("retry after the lock is free = %d %s", again.Status, again.Body)
	}
}
