package pgstore

import (
	"context"
	"encoding/json"
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
func (p *PG) ClaimPooled(ctx context.Context, lab, replaces string, at time.Time, claim func(session.Session) (session.Session, error)) (inst session.Session, err error) {
	err = pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		inst, err = one(tx.Query(ctx, `SELECT `+columns+` FROM sessions
			WHERE pool = 'idle' AND lab = $1 AND status = 'running' AND expires_at > $2
			ORDER BY started_at, id LIMIT 1 FOR UPDATE SKIP LOCKED`, lab, at))
		if err != nil {
			return err
		}
		row, err := tx.Exec(ctx, `DELETE FROM sessions WHERE id = $1 AND status = 'provisioning' AND pool = ''`, replaces)
		if err != nil {
			return err
		}
		entry, err := tx.Exec(ctx, `DELETE FROM waitlist WHERE id = $1`, replaces)
		if err != nil {
			return err
		}
		if row.RowsAffected()+entry.RowsAffected() == 0 {
			return fmt.Errorf("%w: %s is neither a provisioning open nor a waitlist entry any more", session.ErrNoSession, replaces)
		}
		c, err := claim(inst)
		if err != nil {
			return err
		}
		nodes, err := json.Marshal(nonNil(c.Nodes))
		if err != nil {
			return err
		}
		// A failed update leaves inst as it was: the caller retires the
		// instance the student's key may have reached.
		claimed, err := one(tx.Query(ctx, `UPDATE sessions SET student = $2, student_key = $3, started_at = $4,
			expires_at = $5, max_expires_at = $6, ready_at = $7, nodes = $8, pool = 'claimed', claimed_for = $9
			WHERE id = $1 AND pool = 'idle' AND status = 'running' RETURNING `+columns,
			inst.ID, c.Student, c.StudentKey, c.StartedAt, c.ExpiresAt, c.MaxExpiresAt, nullTime(c.ReadyAt), nodes, replaces))
		if err != nil {
			return err
		}
		inst = claimed
		return nil
	})
	if errors.Is(err, session.ErrNoSession) && inst.ID == "" {
		return inst, fmt.Errorf("%w: no ready warm pool instance of %s", session.ErrNoSession, lab)
	}
	return inst, err
}
