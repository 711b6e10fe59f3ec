package pgstore

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
)

// ReapRun is the stored report of one reaper run (issue 4).
type ReapRun struct {
	ID int64 `json:"id"`
	// Trigger is what started the run, e.g. "schedule" or "admin".
	Trigger    string    `json:"trigger"`
	StartedAt  time.Time `json:"startedAt"`
	FinishedAt time.Time `json:"finishedAt"`
	DryRun     bool      `json:"dryRun"`
	// Counts is items handled per kind, e.g. {"expired": 3, "orphan": 1}.
	Counts map[string]int `json:"counts"`
	// Failures lists every item the run could not handle, with the reason.
	Failures []ReapFailure `json:"failures"`
	// Items lists every item the run handled, or would have in a dry run.
	Items []ReapItem `json:"items"`
}

// ReapItem is one item a reaper run handled (or would have, in a dry run).
type ReapItem struct {
	Kind    string   `json:"kind"`
	Session string   `json:"session"`
	Reason  string   `json:"reason"`
	Objects []string `json:"objects,omitempty"`
}

// ReapFailure is one item a reaper run failed on.
type ReapFailure struct {
	Kind    string `json:"kind"`
	Session string `json:"session,omitempty"`
	Object  string `json:"object,omitempty"`
	Error   string `json:"error"`
}

// RecordRun stores a finished run and returns its id.
func (p *PG) RecordRun(ctx context.Context, r ReapRun) (int64, error) {
	if r.Counts == nil {
		r.Counts = map[string]int{}
	}
	if r.Failures == nil {
		r.Failures = []ReapFailure{}
	}
	if r.Items == nil {
		r.Items = []ReapItem{}
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
	err = p.pool.QueryRow(ctx, `INSERT INTO reap_runs (trigger, started_at, finished_at, dry_run, counts, failures, items)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
		r.Trigger, r.StartedAt, r.FinishedAt, r.DryRun, counts, failures, items).Scan(&id)
	return id, err
}

// RecentRuns returns the latest limit runs, newest first.
func (p *PG) RecentRuns(ctx context.Context, limit int) ([]ReapRun, error) {
	rows, err := p.pool.Query(ctx, `SELECT id, trigger, started_at, finished_at, dry_run, counts, failures, items
		FROM reap_runs ORDER BY started_at DESC, id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReapRun, error) {
		var r ReapRun
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
