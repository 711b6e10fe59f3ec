package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// RecordRun implements reap.Store: it stores a finished run and returns its id.
func (p *PG) RecordRun(ctx context.Context, r reap.Report) (int64, error) {
	if r.Counts == nil {
		r.Counts = map[reap.ItemKind]int{}
	}
	if r.Failures == nil {
		r.Failures = []reap.Failure{}
	}
	if r.Items == nil {
		r.Items = []reap.Reaped{}
	}
	items, err := json.Marshal(r.Items)
	if err != nil {
		return 0, err
	}
	counts, err := json.Marshal(r.Counts)
	if err != nil {
		return 0, err
	}
	failures, err := json.Marshal(r.Failures)
	if err != nil {
		return 0, err
	}
	var id int64
	err = p.conns.QueryRow(ctx, `INSERT INTO reap_runs (trigger, started_at, finished_at, dry_run, counts, failures, items)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
		r.Trigger, r.StartedAt, r.FinishedAt, r.DryRun, counts, failures, items).Scan(&id)
	return id, err
}

// RecentRuns implements reap.StatusSource: the latest limit runs, newest first.
func (p *PG) RecentRuns(ctx context.Context, limit int) ([]reap.Report, error) {
	rows, err := p.conns.Query(ctx, `SELECT id, trigger, started_at, finished_at, dry_run, counts, failures, items
		FROM reap_runs ORDER BY started_at DESC, id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (reap.Report, error) {
		var r reap.Report
		var counts, failures, items []byte
		if err := row.Scan(&r.ID, &r.Trigger, &r.StartedAt, &r.FinishedAt, &r.DryRun, &counts, &failures, &items); err != nil {
			return r, err
		}
		r.StartedAt, r.FinishedAt = r.StartedAt.UTC(), r.FinishedAt.UTC()
		if err := json.Unmarshal(counts, &r.Counts); err != nil {
			return r, err
		}
		if err := json.Unmarshal(items, &r.Items); err != nil {
			return r, err
		}
		return r, json.Unmarshal(failures, &r.Failures)
	})
}

// PruneRuns implements reap.Store: it deletes at most limit runs that
// started before before, oldest first, in one short statement (the
// reap_runs_recent index finds them), and returns how many it deleted.
func (p *PG) PruneRuns(ctx context.Context, before time.Time, limit int) (int, error) {
	tag, err := p.conns.Exec(ctx, `DELETE FROM reap_runs WHERE id IN (
		SELECT id FROM reap_runs WHERE started_at < $1 ORDER BY started_at, id LIMIT $2)`, before, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting old reaper runs: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// PruneRefused implements reap.Store: it deletes at most limit rows of
// opens refused for lack of capacity (failed, end_kind no_capacity,
// end_actor open) that finished before before, oldest first, in one short
// statement (the sessions_refused index finds them), and returns how many
// it deleted. Every row of the database is this environment's (Open
// refuses a database another environment recorded), so, as every other
// sessions query, it needs no environment filter.
func (p *PG) PruneRefused(ctx context.Context, before time.Time, limit int) (int, error) {
	tag, err := p.conns.Exec(ctx, `DELETE FROM sessions WHERE id IN (
		SELECT id FROM sessions WHERE status = 'failed' AND end_kind = 'no_capacity' AND end_actor = 'open'
			AND finished_at < $1 ORDER BY finished_at, id LIMIT $2)`, before, limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// HomeUse implements reap.Store: one query over the sessions that held
// the homes named (sessions_by_home).
func (p *PG) HomeUse(ctx context.Context, homes []string) (map[string]reap.HomeUse, error) {
	rows, err := p.conns.Query(ctx, `SELECT home, bool_or(status IN `+liveStatuses+`), max(finished_at), min(student)
		FROM sessions WHERE home = ANY($1) GROUP BY home`, homes)
	if err != nil {
		return nil, err
	}
	use := map[string]reap.HomeUse{}
	var name, student string
	var live bool
	var last *time.Time
	_, err = pgx.ForEachRow(rows, []any{&name, &live, &last, &student}, func() error {
		u := reap.HomeUse{Live: live, Student: student}
		if last != nil {
			u.LastEnded = last.UTC()
		}
		use[name] = u
		return nil
	})
	return use, err
}

// Suspects implements reap.Store: the suspects the last run handed on.
func (p *PG) Suspects(ctx context.Context) ([]reap.Suspect, error) {
	rows, err := p.conns.Query(ctx, `SELECT session_id, object, trouble, detail, since FROM reap_suspects`)
	if err != nil {
		return nil, fmt.Errorf("reading reaper suspects: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (reap.Suspect, error) {
		var s reap.Suspect
		err := row.Scan(&s.Session, &s.Object, &s.Trouble, &s.Detail, &s.Since)
		s.Since = s.Since.UTC()
		return s, err
	})
}

// SaveSuspects implements reap.Store: it replaces the stored suspects with
// s in one transaction, so a run that fails half-way leaves the last set.
func (p *PG) SaveSuspects(ctx context.Context, s []reap.Suspect) error {
	ids, objects, troubles, details, since := make([]string, len(s)), make([]string, len(s)), make([]string, len(s)), make([]string, len(s)), make([]time.Time, len(s))
	for i, x := range s {
		ids[i], objects[i], troubles[i], details[i], since[i] = x.Session, x.Object, string(x.Trouble), x.Detail, x.Since
	}
	err := pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM reap_suspects`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO reap_suspects (session_id, object, trouble, detail, since)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[])
			ON CONFLICT DO NOTHING`, ids, objects, troubles, details, since)
		return err
	})
	if err != nil {
		return fmt.Errorf("storing reaper suspects: %w", err)
	}
	return nil
}

// Take implements reap.Store: in one short transaction it re-reads the
// row FOR UPDATE and, if it is live and due, moves expires_at back by one
// microsecond (PostgreSQL's resolution). Extend's compare-and-set on the
// expiry it read then fails, and the Service re-reads a session that is
// over. The expiry moves earlier, never later: an expired row stays
// expired, and a row that was not due is not touched.
func (p *PG) Take(ctx context.Context, id string, due func(session.Session) bool) (s session.Session, ok bool, err error) {
	err = pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		if s, err = lockRow(ctx, tx, id, "FOR UPDATE"); err != nil {
			return err
		}
		if !s.Status.Live() || !due(s) {
			return nil
		}
		if s, err = one(tx.Query(ctx, `UPDATE sessions SET expires_at = expires_at - interval '1 microsecond'
			WHERE id = $1 RETURNING `+columns, id)); err != nil {
			return err
		}
		ok = true
		return nil
	})
	return s, ok, err
}
