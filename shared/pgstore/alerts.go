package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"labkeep/shared/alerts"
	"labkeep/shared/session"
)

var _ alerts.Store = (*PG)(nil)

// alertLockSpace is the first key of the per-session alert locks.
const alertLockSpace = 7007

// AddAlert implements alerts.Store: the standing read, the insert and the
// trim to the l.PerSession newest are one transaction under the session's
// alert lock, so a session never holds more than PerSession alerts and
// never takes more than the rate allows, however many posts arrive at once.
func (p *PG) AddAlert(ctx context.Context, a alerts.Alert, l alerts.Limits) (alerts.Alert, error) {
	if a.Fields == nil {
		a.Fields = map[string]string{}
	}
	fields, err := json.Marshal(a.Fields)
	if err != nil {
		return a, err
	}
	err = pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		// One writer per session at a time (a transaction-scoped lock in
		// the two-key space, apart from lockKey's): two concurrent trims
		// would each miss the other's row and leave keep+1, two posts
		// would each miss the other in the rate.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, alertLockSpace, a.Session); err != nil {
			return err
		}
		var st alerts.Standing
		var ended *time.Time
		if err := tx.QueryRow(ctx, `SELECT finished_at FROM sessions WHERE id = $1`, a.Session).Scan(&ended); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: no session %s", session.ErrNoSession, a.Session)
			}
			return err
		}
		if ended != nil {
			st.Ended = ended.UTC()
		}
		if r := l.Rate(); r.Max > 0 {
			rows, err := tx.Query(ctx, `SELECT received FROM guardian_alerts WHERE session_id = $1 AND received > $2
				ORDER BY received DESC LIMIT $3`, a.Session, r.Since(a.Received), r.Max)
			if err != nil {
				return err
			}
			if st.Recent, err = pgx.CollectRows(rows, pgx.RowTo[time.Time]); err != nil {
				return err
			}
		}
		if err := l.Admit(st, a.Received); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `INSERT INTO guardian_alerts
			(session_id, kind, subject, severity, message, fields, workspace, first_at, last_at, count, received)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id`,
			a.Session, a.Kind, a.Subject, string(a.Severity), a.Message, fields, a.Workspace, a.First, a.Last, a.Count, a.Received,
		).Scan(&a.ID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM guardian_alerts WHERE session_id = $1 AND id NOT IN
			(SELECT id FROM guardian_alerts WHERE session_id = $1 ORDER BY id DESC LIMIT $2)`, a.Session, l.PerSession)
		return err
	})
	return a, err
}

// Counts implements alerts.Store.
func (p *PG) Counts(ctx context.Context, sessions []string) (map[string]int, error) {
	rows, err := p.conns.Query(ctx, `SELECT session_id::text, count(*) FROM guardian_alerts
		WHERE session_id::text = ANY($1) GROUP BY session_id`, sessions)
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		counts[id] = n
		return nil
	})
	return counts, err
}

// Alerts implements alerts.Store.
func (p *PG) Alerts(ctx context.Context, sessionID string, limit int) ([]alerts.Alert, error) {
	rows, err := p.conns.Query(ctx, `SELECT id, session_id, kind, subject, severity, message, fields, workspace,
		first_at, last_at, count, received FROM guardian_alerts
		WHERE $1 = '' OR session_id::text = $1 ORDER BY id DESC LIMIT $2`, sessionID, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (alerts.Alert, error) {
		var a alerts.Alert
		var id [16]byte
		var sev string
		var fields []byte
		if err := row.Scan(&a.ID, &id, &a.Kind, &a.Subject, &sev, &a.Message, &fields, &a.Workspace,
			&a.First, &a.Last, &a.Count, &a.Received); err != nil {
			return a, err
		}
		a.Session, a.Severity = formatUUID(id), alerts.Severity(sev)
		a.First, a.Last, a.Received = a.First.UTC(), a.Last.UTC(), a.Received.UTC()
		if err := json.Unmarshal(fields, &a.Fields); err != nil {
			return a, err
		}
		if len(a.Fields) == 0 {
			a.Fields = nil
		}
		return a, nil
	})
}
