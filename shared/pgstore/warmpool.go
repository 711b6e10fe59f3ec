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

// ClaimPooled implements seating.PoolStore. The instance is picked with FOR
// UPDATE SKIP LOCKED, so concurrent claims each take a different instance
// (or none) and never wait for one another, and an End in progress on an
// instance (the reaper retiring it) keeps it out of reach. The replaced
// row or entry is deleted first, inside the transaction, so a student who
// closed or left meanwhile gets nothing and the instance stays idle; the
// cluster step (claim) runs while the row lock is held, and its failure
// rolls everything back. An instance whose TTL has passed is never
// claimed: its anchor's deadline covers a claim within the TTL only.
func (p *PG) ClaimPooled(ctx context.Context, lab, replaces string, at time.Time, claim func(seating.Instance) (seating.Handover, error)) (inst seating.Instance, claimed session.Session, err error) {
	err = pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		row, err := one(tx.Query(ctx, `SELECT `+columns+` FROM sessions
			WHERE pool = 'idle' AND lab = $1 AND status = 'running' AND expires_at > $2
			ORDER BY started_at, id LIMIT 1 FOR UPDATE SKIP LOCKED`, lab, at))
		if err != nil {
			return err
		}
		inst = instanceOf(row)
		open, err := tx.Exec(ctx, `DELETE FROM sessions WHERE id = $1 AND status = 'provisioning' AND pool = ''`, replaces)
		if err != nil {
			return err
		}
		entry, err := tx.Exec(ctx, `DELETE FROM waitlist WHERE id = $1`, replaces)
		if err != nil {
			return err
		}
		if open.RowsAffected()+entry.RowsAffected() == 0 {
			return fmt.Errorf("%w: %s is neither a provisioning open nor a waitlist entry any more", session.ErrNoSession, replaces)
		}
		h, err := claim(inst)
		if err != nil {
			return err
		}
		// A failed update leaves the instance as it was: the caller
		// retires the instance the student's key may have reached.
		claimed, err = one(tx.Query(ctx, `UPDATE sessions SET student = $2, student_key = $3, started_at = $4,
			expires_at = $5, max_expires_at = $6, ready_at = $7, pool = 'claimed', claimed_for = $8
			WHERE id = $1 AND pool = 'idle' AND status = 'running' RETURNING `+columns,
			inst.ID, h.Student, h.StudentKey, h.StartedAt, h.ExpiresAt, h.MaxExpiresAt, nullTime(h.ReadyAt), replaces))
		return err
	})
	if err != nil {
		claimed = session.Session{}
	}
	if errors.Is(err, session.ErrNoSession) && inst.ID == "" {
		return inst, claimed, fmt.Errorf("%w: no ready warm pool instance of %s", session.ErrNoSession, lab)
	}
	return inst, claimed, err
}

// instanceOf is the warm-pool instance an idle row stores.
func instanceOf(row session.Session) seating.Instance {
	return seating.Instance{ID: row.ID, Lab: row.Lab, Kind: row.Kind, Nodes: row.Nodes, Window: row.Window,
		Ready: row.Status == session.StatusRunning}
}
