package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/labs"
	"labkeep/shared/pgstore"
	"labkeep/shared/reservation"
	"labkeep/shared/seating"
	"labkeep/shared/session"
)

// pooledAndOpen stores a ready idle instance and a student's provisioning
// open, and returns both.
func pooledAndOpen(t *testing.T, pg *pgstore.PG, student string) (inst, open session.Session) {
	t.Helper()
	inst = newSession(seating.PoolStudent)
	inst.Pool = session.PoolIdle
	open = newSession(student)
	for _, s := range []session.Session{inst, open} {
		if err := pg.Create(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pg.MarkRunning(context.Background(), inst.ID, t0.Add(time.Second), inst.Nodes); err != nil {
		t.Fatal(err)
	}
	return inst, open
}

// TestClaimPooledReturnsTheInstanceWhenItsUpdateFails: the claim's last
// step, the handover after the cluster step, can fail (here: the caller's
// context ends during the cluster step). The caller must still learn
// which instance the student's key may have reached, to retire it; the
// instance stays spent (never claimable again), due when the claim was
// bound to end, and the open's row stays.
func TestClaimPooledReturnsTheInstanceWhenItsUpdateFails(t *testing.T) {
	pg := openStore(t)
	inst, open := pooledAndOpen(t, pg, "alice")
	abandon := t0.Add(2 * time.Minute)

	ctx, cancel := context.WithCancel(context.Background())
	got, claimed, err := pg.ClaimPooled(ctx, inst.Lab, 0, open.ID, t0.Add(time.Minute), abandon, func(i seating.Instance) (seating.Handover, error) {
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
	if after.Pool != session.PoolSpent || after.Student != seating.PoolStudent || !after.ExpiresAt.Equal(abandon) {
		t.Errorf("instance after the failed claim: pool %q, student %q, expires %s; want spent, %q, at %s", after.Pool, after.Student, after.ExpiresAt, seating.PoolStudent, abandon)
	}
	if _, err := pg.Get(context.Background(), open.ID); err != nil {
		t.Errorf("the open's row after the failed claim: %v; want it kept", err)
	}
}

// An instance a failed claim may have written a key to is never handed to
// anyone: between the failure and its retirement, another student's
// claim finds no ready instance. A student read never returns it, and the
// instance the first claim read is spent already while its cluster step
// runs.
func TestFailedClaimsInstanceIsNeverClaimedAgain(t *testing.T) {
	pg := openStore(t)
	ctx := context.Background()
	inst, first := pooledAndOpen(t, pg, "alice")
	second := newSession("bob")
	if err := pg.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	at, abandon := t0.Add(time.Minute), t0.Add(2*time.Minute)
	_, _, err := pg.ClaimPooled(ctx, inst.Lab, 0, first.ID, at, abandon, func(i seating.Instance) (seating.Handover, error) {
		during, err := pg.Get(ctx, i.ID)
		if err != nil || during.Pool != session.PoolSpent {
			t.Errorf("instance while the cluster step runs: pool %q, %v; want spent (committed before any key is written)", during.Pool, err)
		}
		return seating.Handover{}, errors.New("exec wrote the key, then failed")
	})
	if err == nil {
		t.Fatal("ClaimPooled with a failing cluster step succeeded")
	}
	got, claimed, err := pg.ClaimPooled(ctx, inst.Lab, 0, second.ID, at, abandon, func(i seating.Instance) (seating.Handover, error) {
		t.Errorf("bob's claim reached instance %s", i.ID)
		return seating.Handover{Student: "bob", StudentKey: "ssh-ed25519 BBBB", Window: second.Window, ReadyAt: at}, nil
	})
	if !errors.Is(err, session.ErrNoSession) || got.ID != "" || claimed.ID != "" {
		t.Errorf("bob's claim after alice's failed = instance %q, session %q, %v; want no ready instance", got.ID, claimed.ID, err)
	}
	for _, student := range []string{seating.PoolStudent, "alice"} {
		if s, err := pg.Latest(ctx, student); err == nil && s.ID == inst.ID {
			t.Errorf("Latest(%q) returned the spent instance", student)
		}
		if s, err := pg.LiveFor(ctx, student); err == nil && s.ID == inst.ID {
			t.Errorf("LiveFor(%q) returned the spent instance", student)
		}
	}
}

// A member who gets an instance of the general pool takes their class's
// seat with the handover itself: the claimed session names the
// reservation, and the reservation counts the seat taken, with no moment
// between where the seat counts as free. A claim for no seat leaves the
// instance in no reservation.
func TestClaimTakesTheSeatWithTheHandover(t *testing.T) {
	pg := openStore(t)
	ctx := context.Background()
	start := t0.Add(time.Minute)
	class, err := pg.Reserve(ctx, reservation.Booked{Hold: reservation.Hold{Reservation: reservation.Reservation{Course: "cs-101", Lab: "shell", Seats: 2,
		Start: start, End: start.Add(time.Hour)}, Kind: labs.KindPod, PerSeat: 1}, BookedBy: "prof", BookedAt: t0},
		start, start.Add(time.Hour), func([]reservation.Hold) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	at, abandon := start.Add(time.Minute), start.Add(2*time.Minute)
	for _, tc := range []struct {
		student string
		seat    int64
	}{{"ann", class.ID}, {"bob", 0}} {
		inst, open := pooledAndOpen(t, pg, tc.student)
		_, claimed, err := pg.ClaimPooled(ctx, inst.Lab, 0, open.ID, at, abandon, func(seating.Instance) (seating.Handover, error) {
			return seating.Handover{Student: tc.student, StudentKey: "ssh-ed25519 AAAA", Window: open.Window, ReadyAt: at, Seat: tc.seat}, nil
		})
		if err != nil {
			t.Fatalf("%s's claim: %v", tc.student, err)
		}
		if claimed.Reservation != tc.seat {
			t.Errorf("%s's claimed session is in reservation %d; want %d", tc.student, claimed.Reservation, tc.seat)
		}
	}
	_, uses, err := pg.Holding(ctx, at, at.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(reservation.Use{Taken: 1}, uses[class.ID]); diff != "" {
		t.Errorf("the class's seats after ann's claim (-want +got):\n%s", diff)
	}
}
