package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"labkeep/shared/seating"
	"labkeep/shared/session"
)

var _ seating.PoolStore = (*PG)(nil)

// ClaimPooled implements seating.PoolStore in two transactions around the
// cluster step. The first picks the instance with FOR UPDATE SKIP LOCKED,
// so concurrent claims each take a different instance (or none) and never
// wait for one another, and an End in progress on an instance (the reaper
// retiring it) keeps it out of reach; it checks that the replaced row or
// entry still exists (a student who closed or left meanwhile gets nothing
// and the instance stays idle), and commits the instance as spent, due at
// abandon, before claim runs: from then on no claim picks it, whatever
// happens to this one, and if this process dies mid-claim the reaper ends
// it at abandon. The second deletes the replaced row or entry and hands
// the spent instance over. An instance whose TTL has passed is never
// claimed: its anchor's deadline covers a claim within the TTL only. A
// class's instance (reservation_id set) is claimed only for that
// reservation, a general one only for none.
func (p *PG) ClaimPooled(ctx context.Context, lab string, class int64, replaces string, at, abandon time.Time, claim func(seating.Instance) (seating.Handover, error)) (inst seating.Instance, claimed session.Session, err error) {
	err = pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		row, err := one(tx.Query(ctx, `SELECT `+columns+` FROM sessions
			WHERE pool = 'idle' AND lab = $1 AND status = 'running' AND expires_at > $2 AND coalesce(reservation_id, 0) = $3
			ORDER BY started_at, id LIMIT 1 FOR UPDATE SKIP LOCKED`, lab, at, class))
		if err != nil {
			return err
		}
		inst = instanceOf(row)
		if err := replaced(ctx, tx, replaces, false); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE sessions SET pool = 'spent',
			expires_at = least(expires_at, $2), max_expires_at = least(max_expires_at, $2) WHERE id = $1`, inst.ID, abandon)
		return err
	})
	if err != nil {
		if errors.Is(err, session.ErrNoSession) && inst.ID == "" {
			err = fmt.Errorf("%w: no ready warm pool instance of %s (reservation %d)", session.ErrNoSession, lab, class)
		}
		// Nothing was committed: the instance (if one was read) is idle
		// as it was.
		return inst, session.Session{}, err
	}
	h, err := claim(inst)
	if err != nil {
		return inst, session.Session{}, err
	}
	err = pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		if err := replaced(ctx, tx, replaces, true); err != nil {
			return err
		}
		claimed, err = one(tx.Query(ctx, `UPDATE sessions SET student = $2, student_key = $3, started_at = $4,
			expires_at = $5, max_expires_at = $6, ready_at = $7, pool = 'claimed', claimed_for = $8,
			reservation_id = coalesce(nullif($9::bigint, 0), reservation_id)
			WHERE id = $1 AND pool = 'spent' AND status = 'running' RETURNING `+columns,
			inst.ID, h.Student, h.StudentKey, h.StartedAt, h.ExpiresAt, h.MaxExpiresAt, nullTime(h.ReadyAt), replaces, h.Seat))
		return err
	})
	if err != nil {
		return inst, session.Session{}, err
	}
	return inst, claimed, nil
}

// replaced checks (or, with del, deletes) the open's provisioning row or
// the waitlist entry a claim replaces; session.ErrNoSession if neither
// exists any more.
func replaced(ctx context.Context, tx pgx.Tx, id string, del bool) error {
	verb := "SELECT 1 FROM"
	if del {
		verb = "DELETE FROM"
	}
	open, err := tx.Exec(ctx, verb+` sessions WHERE id = $1 AND status = 'provisioning' AND pool = ''`, id)
	if err != nil {
		return err
	}
	entry, err := tx.Exec(ctx, verb+` waitlist WHERE id = $1`, id)
	if err != nil {
		return err
	}
	if open.RowsAffected()+entry.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s is neither a provisioning open nor a waitlist entry any more", session.ErrNoSession, id)
	}
	return nil
}

// instanceOf is the warm-pool instance an idle row stores.
func instanceOf(row session.Session) seating.Instance {
	return seating.Instance{ID: row.ID, Lab: row.Lab, Kind: row.Kind, Nodes: row.Nodes, Window: row.Window,
		Ready: row.Status == session.StatusRunning}
}
