package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"labkeep/shared/labs"
	"labkeep/shared/reservation"
	"labkeep/shared/session"
)

var _ reservation.Store = (*PG)(nil)

// reservationLockSpace is the first key of the booking lock (a
// transaction lock in the two-key space, apart from lockKey's).
const reservationLockSpace = 7008

const reservationColumns = `id, course, lab, seats, kind, per_seat, starts_at, ends_at, booked_by, booked_at, cancelled_at`

// standingBetween selects the standing reservations whose windows overlap
// $1 to $2, by start.
const standingBetween = `SELECT ` + reservationColumns + ` FROM reservations
	WHERE cancelled_at IS NULL AND ends_at > $1 AND starts_at < $2 ORDER BY starts_at, id`

// Reserve implements reservation.Store: the overlapping reservations are
// read, decide runs and the new one is inserted in one transaction under
// the environment's booking lock, so bookings never interleave.
func (p *PG) Reserve(ctx context.Context, h reservation.Booked, from, to time.Time, decide func(overlapping []reservation.Hold) error) (reservation.Booked, error) {
	var out reservation.Booked
	err := pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, reservationLockSpace, p.env); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, standingBetween, from, to)
		if err != nil {
			return err
		}
		overlapping, err := pgx.CollectRows(rows, scanBooked)
		if err != nil {
			return err
		}
		holds := make([]reservation.Hold, len(overlapping))
		for i, b := range overlapping {
			holds[i] = b.Hold
		}
		if err := decide(holds); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `INSERT INTO reservations (course, lab, seats, kind, per_seat, starts_at, ends_at, booked_by, booked_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING `+reservationColumns,
			h.Course, h.Lab, h.Seats, string(h.Kind), h.PerSeat, h.Start, h.End, h.BookedBy, h.BookedAt)
		if err != nil {
			return err
		}
		out, err = pgx.CollectExactlyOneRow(rows, scanBooked)
		return err
	})
	return out, err
}

// Reservations implements reservation.Store.
func (p *PG) Reservations(ctx context.Context, from, to time.Time) ([]reservation.Booked, error) {
	rows, err := p.conns.Query(ctx, standingBetween, from, to)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanBooked)
}

// Cancel implements reservation.Store.
func (p *PG) Cancel(ctx context.Context, id int64, courses []string, at time.Time) (reservation.Booked, error) {
	// A nil slice is SQL NULL: any course.
	rows, err := p.conns.Query(ctx, `UPDATE reservations SET cancelled_at = $2
		WHERE id = $1 AND cancelled_at IS NULL AND ($3::text[] IS NULL OR course = ANY($3))
		RETURNING `+reservationColumns, id, at, courses)
	if err != nil {
		return reservation.Booked{}, err
	}
	b, err := pgx.CollectExactlyOneRow(rows, scanBooked)
	if errors.Is(err, pgx.ErrNoRows) {
		if courses != nil {
			return b, fmt.Errorf("%w: no reservation %d of your courses (%s), or it was cancelled already", reservation.ErrNoReservation, id, strings.Join(courses, ", "))
		}
		return b, fmt.Errorf("%w: no reservation %d (or it was cancelled already)", reservation.ErrNoReservation, id)
	}
	return b, err
}

func scanBooked(row pgx.CollectableRow) (reservation.Booked, error) {
	var b reservation.Booked
	var kind string
	var cancelled *time.Time
	err := row.Scan(&b.ID, &b.Course, &b.Lab, &b.Seats, &kind, &b.PerSeat, &b.Start, &b.End, &b.BookedBy, &b.BookedAt, &cancelled)
	b.Kind = labs.Kind(kind)
	b.Start, b.End, b.BookedAt = b.Start.UTC(), b.End.UTC(), b.BookedAt.UTC()
	if cancelled != nil {
		b.CancelledAt = cancelled.UTC()
	}
	return b, err
}

// Holding implements seating.Reservations: the standing reservations whose
// windows overlap from to to, and how live sessions use the seats of
// each (an unclaimed warm instance's row is pooled, any other live row
// taken); two queries.
func (p *PG) Holding(ctx context.Context, from, to time.Time) ([]reservation.Hold, map[int64]reservation.Use, error) {
	booked, err := p.Reservations(ctx, from, to)
	if err != nil || len(booked) == 0 {
		return nil, nil, err
	}
	holds := make([]reservation.Hold, len(booked))
	ids := make([]int64, len(booked))
	for i, b := range booked {
		holds[i], ids[i] = b.Hold, b.ID
	}
	rows, err := p.conns.Query(ctx, `SELECT reservation_id, count(*) FILTER (WHERE pool <> 'idle'), count(*) FILTER (WHERE pool = 'idle')
		FROM sessions WHERE reservation_id = ANY($1) AND status IN `+liveStatuses+` GROUP BY reservation_id`, ids)
	if err != nil {
		return nil, nil, err
	}
	uses := map[int64]reservation.Use{}
	var id, taken, pooled int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &taken, &pooled}, func() error {
		uses[id] = reservation.Use{Taken: int(taken), Pooled: int(pooled)}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	return holds, uses, nil
}

// TakeSeat implements seating.Reservations.
func (p *PG) TakeSeat(ctx context.Context, id string, reservationID int64) error {
	tag, err := p.conns.Exec(ctx, `UPDATE sessions SET reservation_id = $2 WHERE id = $1 AND status IN `+liveStatuses, id, reservationID)
	if err == nil && tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: session %s is not live", session.ErrNotLive, id)
	}
	return err
}
