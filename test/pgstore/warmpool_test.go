package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"labkeep/shared/seating"
	"labkeep/shared/session"
)

// TestClaimPooledReturnsTheInstanceWhenItsUpdateFails: the claim's last
// step, the row update after the cluster step, can fail (here: the
// caller's context ends during the cluster step). The caller must still
// learn which instance the student's key may have reached, to retire it,
// and the instance and the open's row stay as they were.
func TestClaimPooledReturnsTheInstanceWhenItsUpdateFails(t *testing.T) {
	pg := openStore(t)
	inst := newSession(seating.PoolStudent)
	inst.Pool = session.PoolIdle
	open := newSession("alice")
	for _, s := range []session.Session{inst, open} {
		if err := pg.Create(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pg.MarkRunning(context.Background(), inst.ID, t0.Add(time.Second), inst.Nodes); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	got, claimed, err := pg.ClaimPooled(ctx, inst.Lab, open.ID, t0.Add(time.Minute), func(i seating.Instance) (seating.Handover, error) {
		cancel() // the cluster step succeeded, but the caller gave up meanwhile
		return seating.Handover{Student: open.Student, StudentKey: "ssh-ed25519 AAAA", Window: open.Window, ReadyAt: t0.Add(time.Minute)}, nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("ClaimPooled with the context ended during the claim = %v; want context.Canceled", err)
	}
	if got.ID != inst.ID {
		t.Errorf("ClaimPooled returned instance %q; want %q, the one the claim reached", got.ID, inst.ID)
	}
	if claimed.ID != "" {
		t.Errorf("ClaimPooled returned claimed session %q with its error; want none", claimed.ID)
	}
	after, err := pg.Get(context.Background(), inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.Pool != session.PoolIdle || after.Student != seating.PoolStudent {
		t.Errorf("instance after the failed claim: pool %q, student %q; want it unchanged (idle, %q)", after.Pool, after.Student, seating.PoolStudent)
	}
	if _, err := pg.Get(context.Background(), open.ID); err != nil {
		t.Errorf("the open's row after the failed claim: %v; want it kept", err)
	}
}
