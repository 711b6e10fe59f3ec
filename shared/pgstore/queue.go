package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"labkeep/shared/seating"
	"labkeep/shared/session"
)

var _ seating.Waitlist = (*PG)(nil)

const entryColumns = `id, seq, student, lab, student_key, enqueued_at, polled_at`

// Enqueue implements seating.Waitlist: the open's provisioning row goes
// and the entry comes in one transaction; seq (the arrival order) is the
// database's.
func (p *PG) Enqueue(ctx context.Context, e seating.Entry) (out seating.Entry, err error) {
	err = pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM sessions WHERE id = $1 AND status = 'provisioning'`, e.ID); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `INSERT INTO waitlist (id, student, lab, student_key, enqueued_at, polled_at)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (student) DO NOTHING RETURNING `+entryColumns,
			e.ID, e.Student, e.Lab, e.StudentKey, e.EnqueuedAt, e.PolledAt)
		if out, err = oneEntry(rows, err); !errors.Is(err, session.ErrNoSession) {
			return err
		}
		out, err = oneEntry(tx.Query(ctx, `SELECT `+entryColumns+` FROM waitlist WHERE student = $1`, e.Student))
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: student %q already waits", session.ErrSessionExists, e.Student)
	})
	if errors.Is(err, session.ErrSessionExists) {
		// The provisioning row is still deleted: the student keeps the
		// place they had.
		if _, derr := p.conns.Exec(ctx, `DELETE FROM sessions WHERE id = $1 AND status = 'provisioning'`, e.ID); derr != nil {
			return out, derr
		}
	}
	return out, err
}

// Line implements seating.Waitlist.
func (p *PG) Line(ctx context.Context) ([]seating.Entry, error) {
	rows, err := p.conns.Query(ctx, `SELECT `+entryColumns+` FROM waitlist ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanEntry)
}

// Touch implements seating.Waitlist. A poll never moves polled_at back.
func (p *PG) Touch(ctx context.Context, student string, at, since time.Time) (seating.Entry, error) {
	return oneEntry(p.conns.Query(ctx, `UPDATE waitlist SET polled_at = greatest(polled_at, $2)
		WHERE student = $1 AND polled_at >= $3 RETURNING `+entryColumns, student, at, since))
}

// Leave implements seating.Waitlist.
func (p *PG) Leave(ctx context.Context, student string) (seating.Entry, error) {
	return oneEntry(p.conns.Query(ctx, `DELETE FROM waitlist WHERE student = $1 RETURNING `+entryColumns, student))
}

// DropIdle implements seating.Waitlist.
func (p *PG) DropIdle(ctx context.Context, before time.Time) ([]seating.Entry, error) {
	rows, err := p.conns.Query(ctx, `DELETE FROM waitlist WHERE polled_at < $1 RETURNING `+entryColumns, before)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanEntry)
}

// Promote implements seating.Waitlist: the entry's delete and the row's
// insert commit together or not at all.
func (p *PG) Promote(ctx context.Context, s session.Session) error {
	nodes, err := json.Marshal(nonNil(s.Nodes))
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM waitlist WHERE id = $1`, s.ID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: no waitlist entry %s", session.ErrNoSession, s.ID)
		}
		_, err = tx.Exec(ctx, insertSession, insertArgs(s, nodes)...)
		return err
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "sessions_one_live_per_student" {
		return fmt.Errorf("%w: student %q already has a live session", session.ErrSessionExists, s.Student)
	}
	return err
}

// RecentlyEnded implements seating.Waitlist.
func (p *PG) RecentlyEnded(ctx context.Context, since time.Time, limit int) ([]session.Session, error) {
	rows, err := p.conns.Query(ctx, `SELECT `+columns+` FROM sessions
		WHERE finished_at > $1 AND status NOT IN `+liveStatuses+` ORDER BY finished_at DESC LIMIT $2`, since, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanSession)
}

// oneEntry collects exactly one entry; ErrNoSession if there is none.
func oneEntry(rows pgx.Rows, err error) (seating.Entry, error) {
	if err != nil {
		return seating.Entry{}, err
	}
	e, err := pgx.CollectExactlyOneRow(rows, scanEntry)
	if errors.Is(err, pgx.ErrNoRows) {
		return e, fmt.Errorf("%w: not in the waitlist", session.ErrNoSession)
	}
	return e, err
}

func scanEntry(row pgx.CollectableRow) (seating.Entry, error) {
	var e seating.Entry
	var id [16]byte
	err := row.Scan(&id, &e.Seq, &e.Student, &e.Lab, &e.StudentKey, &e.EnqueuedAt, &e.PolledAt)
	e.ID = formatUUID(id)
	e.EnqueuedAt, e.PolledAt = e.EnqueuedAt.UTC(), e.PolledAt.UTC()
	return e, err
}
