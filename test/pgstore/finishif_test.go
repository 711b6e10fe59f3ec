package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/pgstore"
	"labkeep/shared/session"
)

var expiredByReaper = session.EndReason{Kind: session.EndExpired, Actor: session.ActorReaper, Detail: "expired at 10:00"}

// finish ends a live row with reason, as any finisher would.
func finish(t *testing.T, pg *pgstore.PG, id string, reason session.EndReason, at time.Time) session.Session {
	t.Helper()
	s, ok, err := pg.FinishIf(context.Background(), id, func(session.Session) bool { return true },
		func(session.Session) (session.EndReason, error) { return reason, nil }, at)
	if err != nil || !ok {
		t.Fatalf("finishing %s: ok %v err %v", id, ok, err)
	}
	return s
}

func TestFinishIf(t *testing.T) {
	ctx := context.Background()
	pg := openStore(t)
	yes := func(session.Session) bool { return true }
	no := func(session.Session) bool { return false }
	ok := func(session.Session) (session.EndReason, error) { return expiredByReaper, nil }
	boom := errors.New("delete refused")
	closedByStudent := session.EndReason{Kind: session.EndClosed, Actor: session.ActorStudent, Detail: "by test"}
	tests := []struct {
		name       string
		finishedBy session.EndReason // finish the row first (zero = leave live)
		due        func(session.Session) bool
		act        func(session.Session) (session.EndReason, error)
		wantErr    error
		wantMarked bool
		wantActRun bool
		wantStatus session.Status
		wantEnd    session.EndReason
	}{
		{name: "due and act succeeds: marked with act's reason", due: yes, act: ok, wantMarked: true, wantActRun: true,
			wantStatus: session.StatusExpired, wantEnd: expiredByReaper},
		{name: "not due: nothing runs, row unchanged", due: no, act: ok, wantStatus: session.StatusProvisioning},
		{name: "act fails: error, row unchanged", due: yes, act: func(session.Session) (session.EndReason, error) { return session.EndReason{}, boom },
			wantErr: boom, wantActRun: true, wantStatus: session.StatusProvisioning},
		{name: "row already final: nothing runs", finishedBy: closedByStudent, due: yes, act: ok,
			wantStatus: session.StatusClosed, wantEnd: closedByStudent},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession("student-" + string(rune('a'+i)))
			if err := pg.Create(ctx, s); err != nil {
				t.Fatal(err)
			}
			if tc.finishedBy.Kind != "" {
				finish(t, pg, s.ID, tc.finishedBy, t0)
			}
			ran := false
			act := func(s session.Session) (session.EndReason, error) { ran = true; return tc.act(s) }
			_, marked, err := pg.FinishIf(ctx, s.ID, tc.due, act, t0.Add(time.Hour))
			if !errors.Is(err, tc.wantErr) || marked != tc.wantMarked || ran != tc.wantActRun {
				t.Fatalf("FinishIf: err %v marked %v act ran %v; want err %v marked %v act ran %v", err, marked, ran, tc.wantErr, tc.wantMarked, tc.wantActRun)
			}
			got, err := pg.Get(ctx, s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tc.wantStatus {
				t.Fatalf("status %s, want %s", got.Status, tc.wantStatus)
			}
			if diff := cmp.Diff(tc.wantEnd, got.End); diff != "" {
				t.Errorf("stored end reason (-want +got):\n%s", diff)
			}
		})
	}
	if _, _, err := pg.FinishIf(ctx, "00000000-0000-4000-8000-000000000000", yes, ok, t0); !errors.Is(err, session.ErrNoSession) {
		t.Fatalf("FinishIf of a missing row: %v, want ErrNoSession", err)
	}
}

// While FinishIf holds the row, an Extend waits; once the row is marked,
// the Extend finds it no longer live.
func TestFinishIfHoldsTheRowAgainstExtend(t *testing.T) {
	ctx := context.Background()
	pg := openStore(t)
	s := newSession("zoe")
	if err := pg.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.MarkRunning(ctx, s.ID, t0.Add(time.Minute), s.Nodes); err != nil {
		t.Fatal(err)
	}
	extended := make(chan error, 1)
	act := func(session.Session) (session.EndReason, error) {
		go func() {
			_, err := pg.Extend(ctx, s.ID, s.ExpiresAt, s.ExpiresAt.Add(30*time.Minute))
			extended <- err
		}()
		select {
		case err := <-extended:
			t.Errorf("Extend went through while the row was held: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		return expiredByReaper, nil
	}
	if _, marked, err := pg.FinishIf(ctx, s.ID, func(session.Session) bool { return true }, act, t0.Add(time.Hour)); err != nil || !marked {
		t.Fatalf("FinishIf: marked %v err %v", marked, err)
	}
	if err := <-extended; !errors.Is(err, session.ErrNotLive) {
		t.Fatalf("Extend after the row was expired: %v, want ErrNotLive", err)
	}
}
