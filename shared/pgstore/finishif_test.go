package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"labkeep/shared/session"
)

func TestFinishIf(t *testing.T) {
	ctx := context.Background()
	pg := openStore(t)
	yes := func(session.Session) bool { return true }
	no := func(session.Session) bool { return false }
	ok := func(session.Session) error { return nil }
	boom := errors.New("delete refused")
	tests := []struct {
		name       string
		finishedBy session.Status // finish the row first ("" = leave live)
		due        func(session.Session) bool
		act        func(session.Session) error
		wantErr    error
		wantMarked bool
		wantActRun bool
		wantStatus session.Status
	}{
		{name: "due and act succeeds: marked", due: yes, act: ok, wantMarked: true, wantActRun: true, wantStatus: session.StatusExpired},
		{name: "not due: nothing runs, row unchanged", due: no, act: ok, wantStatus: session.StatusProvisioning},
		{name: "act fails: error, row unchanged", due: yes, act: func(session.Session) error { return boom }, wantErr: boom, wantActRun: true, wantStatus: session.StatusProvisioning},
		{name: "row already final: nothing runs", finishedBy: session.StatusClosed, due: yes, act: ok, wantStatus: session.StatusClosed},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession("student-" + string(rune('a'+i)))
			if err := pg.Create(ctx, s); err != nil {
				t.Fatal(err)
			}
			if tc.finishedBy != "" {
				if _, err := pg.Finish(ctx, s.ID, tc.finishedBy, "by test", t0); err != nil {
					t.Fatal(err)
				}
			}
			ran := false
			act := func(s session.Session) error { ran = true; return tc.act(s) }
			_, marked, err := pg.FinishIf(ctx, s.ID, tc.due, act, session.StatusExpired, "expired", t0.Add(time.Hour))
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
		})
	}
	if _, _, err := pg.FinishIf(ctx, "00000000-0000-4000-8000-000000000000", yes, ok, session.StatusExpired, "", t0); !errors.Is(err, session.ErrNoSession) {
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
	act := func(session.Session) error {
		go func() {
			_, err := pg.Extend(ctx, s.ID, s.ExpiresAt, s.ExpiresAt.Add(30*time.Minute))
			extended <- err
		}()
		select {
		case err := <-extended:
			t.Errorf("Extend went through while the row was held: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		return nil
	}
	if _, marked, err := pg.FinishIf(ctx, s.ID, func(session.Session) bool { return true }, act, session.StatusExpired, "expired", t0.Add(time.Hour)); err != nil || !marked {
		t.Fatalf("FinishIf: marked %v err %v", marked, err)
	}
	if err := <-extended; !errors.Is(err, session.ErrNotLive) {
		t.Fatalf("Extend after the row was expired: %v, want ErrNotLive", err)
	}
}
