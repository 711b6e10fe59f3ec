package session_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"labkeep/shared/session"
)

// holdCapacity takes the capacity lock the functions share (as another
// open in flight would) and returns its release.
func (e *env) holdCapacity(t *testing.T) func() {
	t.Helper()
	unlock, err := e.app.Store.LockCapacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock) // unlock is idempotent
	return unlock
}

// openQueued starts an open for student while the capacity lock is held
// and returns, once its row is written and it waits for the lock, the
// row's id and a channel with the open's answer.
func (e *env) openQueued(t *testing.T, student, lab string) (string, <-chan response) {
	t.Helper()
	answer := make(chan response, 1)
	go func() { answer <- e.open(student, lab) }()
	var id string
	waitFor(t, 20*time.Second, "the open's row", func() bool {
		err := e.db.QueryRow(context.Background(),
			`SELECT id::text FROM sessions WHERE student = $1 AND status = 'provisioning'`, student).Scan(&id)
		return err == nil
	})
	// The row is written before the lock is requested; give the open a
	// moment to be queued on it (nothing can be created while we hold it).
	time.Sleep(200 * time.Millisecond)
	select {
	case r := <-answer:
		t.Fatalf("open answered %d %s while the capacity lock was held", r.status, r.body)
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
		end        func(t *testing.T, e *env, student, id string)
		wantStatus string
	}{
		{"student closes it", func(t *testing.T, e *env, student, _ string) {
			r := e.do("POST", "/closeSession", e.token(student, "student"), "", "")
			if r.status != 200 || r.session.Status != "closed" {
				t.Fatalf("close while queued = %d %s", r.status, r.body)
			}
		}, "closed"},
		{"reaper fails it as a ghost", func(t *testing.T, e *env, _, id string) {
			// What the reaper's ghost rule writes, through the same store.
			if _, err := e.app.Store.Finish(context.Background(), id, session.StatusFailed,
				"VirtualMachine lk-"+id+"-vm no longer exists", time.Now()); err != nil {
				t.Fatal(err)
			}
		}, "failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			release := e.holdCapacity(t)
			id, answer := e.openQueued(t, "dave", "k8s-cluster")
			tc.end(t, e, "dave", id)
			release()
			var r response
			select {
			case r = <-answer:
			case <-time.After(60 * time.Second):
				t.Fatal("open did not answer after the lock was released")
			}
			if r.status != 502 || r.code != "provisioning_failed" || !strings.Contains(r.message, "ended") {
				t.Errorf("open = %d %q %q, want 502 provisioning_failed saying the session was ended", r.status, r.code, r.message)
			}
			if r.session.ID != id || r.session.Status != tc.wantStatus {
				t.Errorf("answer's session = %s %s, want %s %s", r.session.ID, r.session.Status, id, tc.wantStatus)
			}
			if got := e.rows(); len(got) != 1 || !strings.Contains(got[0], id+" dave "+tc.wantStatus+" ") {
				t.Errorf("rows = %v, want the one %s row", got, tc.wantStatus)
			}
			if left := e.objects(""); len(left) != 0 {
				t.Errorf("objects left: %v", left)
			}
			// The student is free to open again at once.
			if again := e.open("dave", "linux-vm"); again.status != 201 {
				t.Errorf("open again = %d %s", again.status, again.body)
			}
		})
	}
}

// The wait for the capacity lock is bounded by LABKEEP_CAPACITY_WAIT: an
// open queued longer gets 503 no_capacity with Retry-After, its row ends
// failed, nothing is created, and the student may retry.
func TestCapacityWaitExpiryIsNoCapacity(t *testing.T) {
	e := newEnv(t, envOptions{capacityWait: 2 * time.Second})
	release := e.holdCapacity(t)
	began := time.Now()
	r := e.open("fay", "linux-vm")
	took := time.Since(began)
	if r.status != 503 || r.code != "no_capacity" || r.header.Get("Retry-After") != "20" {
		t.Fatalf("open while the lock is held = %d %s (Retry-After %q)", r.status, r.body, r.header.Get("Retry-After"))
	}
	if took < 2*time.Second {
		t.Errorf("answered after %s, before the 2s capacity wait", took)
	}
	t.Logf("no_capacity after %s of waiting: %s", took.Round(time.Millisecond), r.message)
	if n := e.count(`SELECT count(*) FROM sessions WHERE student = 'fay' AND status = 'failed' AND failure_reason LIKE 'no_capacity: waited 2s for the capacity lock%'`); n != 1 {
		t.Errorf("fay's failed rows with the wait as reason = %d, want 1", n)
	}
	if left := e.objects(""); len(left) != 0 {
		t.Errorf("objects left: %v", left)
	}
	release()
	if again := e.open("fay", "linux-vm"); again.status != 201 {
		t.Errorf("retry after the lock is free = %d %s", again.status, again.body)
	}
}
