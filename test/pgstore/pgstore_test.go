// Package pgstore_test tests the PostgreSQL store against a real, throwaway
// PostgreSQL server: its guarantees (one live session per student, the row
// lock of FinishIf, advisory locks, run records) hold only there.
package pgstore_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"labkeep/localrun/pgtest"
	"labkeep/shared/lifetime"
	"labkeep/shared/pgstore"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

var t0 = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

func openStore(t *testing.T) *pgstore.PG {
	t.Helper()
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, "", os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	pg, err := pgstore.Open(ctx, srv.DSN, "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	// A second Open on a migrated database must be a no-op.
	again, err := pgstore.Open(ctx, srv.DSN, "test")
	if err != nil {
		t.Fatalf("re-open: %v", err)
	}
	again.Close()
	return pg
}

func newSession(student string) session.Session {
	return session.Session{
		ID: uuid.NewString(), Student: student, Lab: "linux", Kind: "vm",
		Status:       session.StatusProvisioning,
		Window:       lifetime.Policy{Lifetime: time.Hour, MaxLifetime: 3 * time.Hour}.Open(t0),
		Nodes:        []session.Node{{Name: "vm", Role: "vm", SSHPort: 22}},
		GradingToken: "tok",
	}
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	pg := openStore(t)
	s := newSession("alice")
	if err := pg.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, err := pg.Get(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(s, got); diff != "" {
		t.Errorf("Get after Create (-want +got):\n%s", diff)
	}
	if _, err := pg.Extend(ctx, s.ID, s.ExpiresAt, s.ExpiresAt.Add(time.Minute)); !errors.Is(err, session.ErrNotLive) {
		t.Errorf("Extend while provisioning = %v, want ErrNotLive", err)
	}
	nodes := []session.Node{{Name: "vm", Role: "vm", Ready: true, SSHHost: "10.0.0.1", SSHPort: 22}}
	running, err := pg.MarkRunning(ctx, s.ID, t0.Add(20*time.Second), nodes)
	if err != nil {
		t.Fatal(err)
	}
	if running.Status != session.StatusRunning || running.TimeToReady() != 20*time.Second || !running.Nodes[0].Ready {
		t.Errorf("MarkRunning = %+v", running)
	}
	if _, err := pg.MarkRunning(ctx, s.ID, t0, nodes); !errors.Is(err, session.ErrNotLive) {
		t.Errorf("second MarkRunning = %v, want ErrNotLive", err)
	}
	moved := []session.Node{{Name: "vm", Role: "vm", SSHHost: "10.0.0.2", SSHPort: 22}}
	if got, err := pg.SetNodes(ctx, s.ID, moved); err != nil || got.Status != session.StatusRunning || !cmp.Equal(moved, got.Nodes) {
		t.Errorf("SetNodes = %+v, %v; want running with %+v", got, err, moved)
	}
	ext, err := pg.Extend(ctx, s.ID, s.ExpiresAt, s.ExpiresAt.Add(30*time.Minute))
	if err != nil || !ext.ExpiresAt.Equal(s.ExpiresAt.Add(30*time.Minute)) {
		t.Fatalf("Extend = %+v, %v", ext.Window, err)
	}
	if _, err := pg.Extend(ctx, s.ID, s.ExpiresAt, s.ExpiresAt.Add(40*time.Minute)); !errors.Is(err, session.ErrConflict) {
		t.Errorf("Extend from a stale expiry = %v, want ErrConflict", err)
	}
	if _, err := pg.Extend(ctx, s.ID, ext.ExpiresAt, s.MaxExpiresAt.Add(time.Second)); err == nil {
		t.Error("Extend beyond the cap succeeded")
	}
	live, err := pg.ListLive(ctx)
	if err != nil || len(live) != 1 || live[0].ID != s.ID {
		t.Errorf("ListLive = %v, %v", live, err)
	}
	byStudent := session.EndReason{Kind: session.EndClosed, Actor: session.ActorStudent, Detail: "closed by student alice"}
	closed := finish(t, pg, s.ID, byStudent, t0.Add(time.Hour))
	if closed.Status != session.StatusClosed || closed.End != byStudent {
		t.Fatalf("finished row = %+v", closed)
	}
	if _, err := pg.SetNodes(ctx, s.ID, nodes); !errors.Is(err, session.ErrNotLive) {
		t.Errorf("SetNodes after close = %v, want ErrNotLive", err)
	}
	late := func(session.Session) (session.EndReason, error) { return expiredByReaper, nil }
	if _, ok, err := pg.FinishIf(ctx, s.ID, func(session.Session) bool { return true }, late, t0.Add(time.Hour)); ok || err != nil {
		t.Errorf("second finish: ok %v err %v, want nothing done", ok, err)
	}
	if _, err := pg.LiveFor(ctx, "alice"); !errors.Is(err, session.ErrNoSession) {
		t.Errorf("LiveFor after close = %v, want ErrNoSession", err)
	}
	latest, err := pg.Latest(ctx, "alice")
	if err != nil || latest.ID != s.ID {
		t.Errorf("Latest = %v, %v", latest.ID, err)
	}
	// A finished session frees the student for a new one, which Latest prefers.
	s2 := newSession("alice")
	s2.StartedAt = t0.Add(-time.Hour) // even if it (oddly) started earlier
	if err := pg.Create(ctx, s2); err != nil {
		t.Fatalf("Create after close: %v", err)
	}
	if latest, _ := pg.Latest(ctx, "alice"); latest.ID != s2.ID {
		t.Errorf("Latest = %s, want the live %s", latest.ID, s2.ID)
	}
	if _, err := pg.Get(ctx, "not-a-uuid"); !errors.Is(err, session.ErrNoSession) {
		t.Errorf("Get(not-a-uuid) = %v, want ErrNoSession", err)
	}
}

func TestOneLiveSessionPerStudentUnderConcurrency(t *testing.T) {
	ctx := context.Background()
	pg := openStore(t)
	var wg sync.WaitGroup
	var created, exists atomic.Int32
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := pg.Create(ctx, newSession("bob"))
			switch {
			case err == nil:
				created.Add(1)
			case errors.Is(err, session.ErrSessionExists):
				exists.Add(1)
			default:
				t.Errorf("Create: %v", err)
			}
		}()
	}
	wg.Wait()
	if created.Load() != 1 || exists.Load() != 19 {
		t.Errorf("created=%d exists=%d, want 1 and 19", created.Load(), exists.Load())
	}
}

func TestLockSerialisesAndSurvivesManyWaiters(t *testing.T) {
	ctx := context.Background()
	pg := openStore(t)
	// More waiters than connections in either pool: the holder must never
	// need a second connection, or this deadlocks; and reads must go on
	// while the lock is contended.
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	var reads atomic.Int32
	for range 3 * (int(pg.Conns().Config().MaxConns) + pgstore.LockConns) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock, err := pg.LockCapacity(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			n := inside.Add(1)
			for {
				m := maxInside.Load()
				if n <= m || maxInside.CompareAndSwap(m, n) {
					break
				}
			}
			if _, err := pg.LiveFor(ctx, "nobody"); errors.Is(err, session.ErrNoSession) {
				reads.Add(1)
			}
			time.Sleep(2 * time.Millisecond)
			inside.Add(-1)
			unlock()
		}()
	}
	wg.Wait()
	if maxInside.Load() != 1 {
		t.Errorf("%d holders at once, want 1", maxInside.Load())
	}
	if int(reads.Load()) != 3*(int(pg.Conns().Config().MaxConns)+pgstore.LockConns) {
		t.Errorf("only %d reads while holding the lock succeeded", reads.Load())
	}
	unlock, ok, err := pg.TryLock(ctx, "reap")
	if err != nil || !ok {
		t.Fatalf("TryLock on a free lock = %v, %v", ok, err)
	}
	if _, ok2, err := pg.TryLock(ctx, "reap"); err != nil || ok2 {
		t.Errorf("TryLock on a held lock = %v, %v; want false", ok2, err)
	}
	unlock()
	unlock() // idempotent
	unlock2, ok, err := pg.TryLock(ctx, "reap")
	if err != nil || !ok {
		t.Errorf("TryLock after unlock = %v, %v", ok, err)
	} else {
		unlock2()
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	held, _ := pg.LockCapacity(ctx)
	if _, err := pg.LockCapacity(cctx); err == nil {
		t.Error("LockCapacity returned while the lock was held")
	}
	held()
	again, err := pg.LockCapacity(ctx)
	if err != nil {
		t.Fatalf("lock after a cancelled wait: %v", err)
	}
	again()
}

func TestReapRuns(t *testing.T) {
	ctx := context.Background()
	pg := openStore(t)
	for i, trigger := range []reap.Trigger{reap.TriggerSchedule, reap.TriggerAdmin} {
		_, err := pg.RecordRun(ctx, reap.Report{
			Trigger: trigger, StartedAt: t0.Add(time.Duration(i) * time.Minute), FinishedAt: t0.Add(time.Duration(i)*time.Minute + time.Second),
			Counts:   map[reap.ItemKind]int{"expired": i},
			Failures: []reap.Failure{{Kind: "expired", Session: "s", Error: "boom"}},
			Items:    []reap.Reaped{{Kind: "orphan", Session: "o", Reason: "no live row", Objects: []string{"Secret/x"}}},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	runs, err := pg.RecentRuns(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := []reap.Report{{ID: 2, Trigger: "admin", StartedAt: t0.Add(time.Minute), FinishedAt: t0.Add(time.Minute + time.Second),
		Counts: map[reap.ItemKind]int{"expired": 1}, Failures: []reap.Failure{{Kind: "expired", Session: "s", Error: "boom"}},
		Items: []reap.Reaped{{Kind: "orphan", Session: "o", Reason: "no live row", Objects: []string{"Secret/x"}}}}}
	if diff := cmp.Diff(want, runs); diff != "" {
		t.Errorf("RecentRuns (-want +got):\n%s", diff)
	}
}

// The public halves of a session's SSH credentials are stored and read
// back; the private keys an open issues are never written anywhere in the
// database.
func TestSessionKeysStoredWithoutSecrets(t *testing.T) {
	ctx := context.Background()
	pg := openStore(t)
	s := newSession("kim")
	s.StudentKey, s.HostKey = "ssh-ed25519 AAAAstudent", "ssh-ed25519 AAAAhost"
	s.Issued = session.Issued{StudentPrivateKey: "-----BEGIN OPENSSH PRIVATE KEY----- student", HostPrivateKey: "-----BEGIN OPENSSH PRIVATE KEY----- host"}
	if err := pg.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, err := pg.Get(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.StudentKey != s.StudentKey || got.HostKey != s.HostKey || got.Issued != (session.Issued{}) {
		t.Errorf("read back student key %q host key %q issued %+v", got.StudentKey, got.HostKey, got.Issued)
	}
	var n int
	if err := pg.Conns().QueryRow(ctx, `SELECT count(*) FROM sessions WHERE sessions::text LIKE '%PRIVATE KEY%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d session rows hold a private key", n)
	}
}
