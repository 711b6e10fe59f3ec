// Package pgstore is the PostgreSQL implementation of session.Store (pgx/v5)
// plus what the reaper needs from the database: named advisory locks and
// the record of reaper runs. The schema is embedded and migrated by Open.
// The one-live-session-per-student rule is a partial unique index, and the
// capacity check-and-create is serialised with an advisory lock, so both
// hold across any number of backend instances.
package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// PG is a session store on a set of pgx database connections (Conns).
type PG struct {
	// env is the environment the database belongs to (LABKEEP_ENV); it
	// namespaces the advisory locks.
	env   string
	conns *pgxpool.Pool
	// locks holds the connections that hold or wait for advisory locks, a
	// set of their own so a queue of opens waiting for the capacity lock can
	// never take every connection from reads like getSession.
	locks *pgxpool.Pool
	// tryLocks serves TryLock only: a try must never queue behind
	// connections blocked waiting for the capacity lock (an open storm would
	// otherwise stall the reaper exactly when capacity is scarce).
	tryLocks *pgxpool.Pool
}

// LockConns is how many connections the advisory locks use: waiters beyond it queue
// in the process instead of in PostgreSQL.
const LockConns = 4

var (
	_ session.Store     = (*PG)(nil)
	_ reap.Store        = (*PG)(nil)
	_ reap.StatusSource = (*PG)(nil)
)

// ErrOtherEnvironment means the database belongs to another environment:
// Open refuses it, before migrating anything.
var ErrOtherEnvironment = errors.New("database belongs to another environment")

// Open connects to dsn (pool settings such as pool_max_conns may be given
// in it), migrates the schema and checks that the database belongs to env
// (LABKEEP_ENV): the first labkeep to migrate a database records its
// environment there, and every later Open with another environment fails
// with ErrOtherEnvironment, naming both — one environment's reaper would
// otherwise take the other's sessions for ghosts. Close the store when done.
func Open(ctx context.Context, dsn, env string, opts ...Option) (*PG, error) {
	if env == "" {
		return nil, errors.New("database: the environment is required (the one recorded in the database)")
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	for _, o := range opts {
		o(cfg)
	}
	conns, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := conns.Ping(ctx); err != nil {
		conns.Close()
		return nil, fmt.Errorf("database: %w", err)
	}
	if err := migrate(ctx, conns, env); err != nil {
		conns.Close()
		return nil, err
	}
	lcfg := cfg.Copy()
	lcfg.MaxConns, lcfg.MinConns = LockConns, 0
	locks, err := pgxpool.NewWithConfig(ctx, lcfg)
	if err != nil {
		conns.Close()
		return nil, err
	}
	tcfg := cfg.Copy()
	tcfg.MaxConns, tcfg.MinConns = 2, 0
	tryLocks, err := pgxpool.NewWithConfig(ctx, tcfg)
	if err != nil {
		conns.Close()
		locks.Close()
		return nil, err
	}
	return &PG{env: env, conns: conns, locks: locks, tryLocks: tryLocks}, nil
}

// Close closes both pools.
func (p *PG) Close() {
	p.conns.Close()
	p.locks.Close()
	p.tryLocks.Close()
}

// Conns exposes the main connections for tests and admin reads that
// need plain SQL.
func (p *PG) Conns() *pgxpool.Pool { return p.conns }

const columns = `id, student, lab, kind, status, started_at, expires_at, max_expires_at,
	ready_at, finished_at, nodes, failure_reason, grading_token, end_kind, end_actor, student_key, host_key,
	pool, claimed_for, home, reservation_id`

const liveStatuses = `('provisioning', 'running')`

// Create implements session.Store.
func (p *PG) Create(ctx context.Context, s session.Session) error {
	nodes, err := json.Marshal(nonNil(s.Nodes))
	if err != nil {
		return err
	}
	_, err = p.conns.Exec(ctx, insertSession, insertArgs(s, nodes)...)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "sessions_one_live_per_student" {
		return fmt.Errorf("%w: student %q already has a live session", session.ErrSessionExists, s.Student)
	}
	return err
}

// insertSession inserts one row; its arguments are insertArgs.
const insertSession = `INSERT INTO sessions (` + columns + `)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)`

func insertArgs(s session.Session, nodes []byte) []any {
	return []any{s.ID, s.Student, s.Lab, string(s.Kind), string(s.Status), s.StartedAt, s.ExpiresAt, s.MaxExpiresAt,
		nullTime(s.ReadyAt), nullTime(s.FinishedAt), nodes, s.End.Detail, s.GradingToken, string(s.End.Kind), string(s.End.Actor),
		s.StudentKey, s.HostKey, string(s.Pool), nullUUID(s.ClaimedFor), s.Home, nullID(s.Reservation)}
}

// Get implements session.Store. A session claimed from the warm pool is
// also found by the id the student knew before the claim (ClaimedFor).
func (p *PG) Get(ctx context.Context, id string) (session.Session, error) {
	if _, err := uuid.Parse(id); err != nil {
		// Not an id we ever issued (e.g. a portal passing garbage).
		return session.Session{}, fmt.Errorf("%w: no session %q", session.ErrNoSession, id)
	}
	s, err := p.queryOne(ctx, `SELECT `+columns+` FROM sessions WHERE id = $1 OR claimed_for = $1
		ORDER BY id = $1 DESC LIMIT 1`, id)
	if errors.Is(err, session.ErrNoSession) {
		return s, fmt.Errorf("%w: no session %s", session.ErrNoSession, id)
	}
	return s, err
}

// LiveFor implements session.Store.
func (p *PG) LiveFor(ctx context.Context, student string) (session.Session, error) {
	s, err := p.queryOne(ctx, `SELECT `+columns+` FROM sessions WHERE student = $1 AND status IN `+liveStatuses+` AND pool NOT IN ('idle', 'spent')`, student)
	if errors.Is(err, session.ErrNoSession) {
		return s, fmt.Errorf("%w: no live session", session.ErrNoSession)
	}
	return s, err
}

// Latest implements session.Store.
func (p *PG) Latest(ctx context.Context, student string) (session.Session, error) {
	s, err := p.queryOne(ctx, `SELECT `+columns+` FROM sessions WHERE student = $1 AND pool NOT IN ('idle', 'spent')
		ORDER BY status IN `+liveStatuses+` DESC, started_at DESC LIMIT 1`, student)
	if errors.Is(err, session.ErrNoSession) {
		return s, fmt.Errorf("%w: no session", session.ErrNoSession)
	}
	return s, err
}

// ListLive implements session.Store. One query however many rows, so the
// reaper's database load does not grow with calls per row.
func (p *PG) ListLive(ctx context.Context) ([]session.Session, error) {
	rows, err := p.conns.Query(ctx, `SELECT `+columns+` FROM sessions WHERE status IN `+liveStatuses+` ORDER BY started_at, id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanSession)
}

// MarkRunning implements session.Store.
func (p *PG) MarkRunning(ctx context.Context, id string, readyAt time.Time, nodes []session.Node) (session.Session, error) {
	data, err := json.Marshal(nonNil(nodes))
	if err != nil {
		return session.Session{}, err
	}
	return p.update(ctx, id, `UPDATE sessions SET status = 'running', ready_at = $2, nodes = $3
		WHERE id = $1 AND status = 'provisioning' RETURNING `+columns, id, readyAt, data)
}

// RecentOpens implements session.Store (index sessions_by_student).
func (p *PG) RecentOpens(ctx context.Context, student string, since time.Time, limit int) ([]time.Time, error) {
	rows, err := p.conns.Query(ctx, `SELECT started_at FROM sessions WHERE student = $1 AND started_at > $2
		ORDER BY started_at DESC LIMIT $3`, student, since, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[time.Time])
}

// SetNodes implements session.Store.
func (p *PG) SetNodes(ctx context.Context, id string, nodes []session.Node) (session.Session, error) {
	data, err := json.Marshal(nonNil(nodes))
	if err != nil {
		return session.Session{}, err
	}
	return p.update(ctx, id, `UPDATE sessions SET nodes = $2
		WHERE id = $1 AND status = 'running' RETURNING `+columns, id, data)
}

// Extend implements session.Store.
func (p *PG) Extend(ctx context.Context, id string, from, to time.Time) (session.Session, error) {
	s, err := p.queryOne(ctx, `UPDATE sessions SET expires_at = $3
		WHERE id = $1 AND status = 'running' AND expires_at = $2 AND $3 <= max_expires_at
		RETURNING `+columns, id, from, to)
	if !errors.Is(err, session.ErrNoSession) {
		return s, err
	}
	cur, err := p.Get(ctx, id)
	if err != nil {
		return cur, err
	}
	if cur.Status != session.StatusRunning {
		return cur, fmt.Errorf("%w: session %s is %s", session.ErrNotLive, id, cur.Status)
	}
	if to.After(cur.MaxExpiresAt) {
		return cur, fmt.Errorf("expiry %s beyond the cap %s", to, cur.MaxExpiresAt)
	}
	return cur, session.ErrConflict
}

// update runs a conditional UPDATE … RETURNING on a live row; if it matched
// nothing, it returns the current row with ErrNotLive (or ErrNoSession).
// FinishIf implements session.RowFinisher: it finishes a live session
// under its row lock (SELECT … FOR UPDATE), held while act runs, so no
// Extend, MarkRunning or other finisher can interleave between the decision
// and the mark: it re-reads the row; if the row is no longer live or
// due(row) is false, nothing happens and ok is false; otherwise act runs
// (the cluster deletes) and, only if act returned a nil error, the row gets
// the reason act returned (its status, kind, actor and detail) and finish
// time at. An act error is returned and leaves the row as it was. Returns
// ErrNoSession if there is no such row.
func (p *PG) FinishIf(ctx context.Context, id string, due func(session.Session) bool,
	act func(session.Session) (session.EndReason, error), at time.Time) (s session.Session, ok bool, err error) {
	err = pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		if s, err = lockRow(ctx, tx, id, "FOR UPDATE"); err != nil {
			return err
		}
		if !s.Status.Live() || !due(s) {
			return nil
		}
		reason, err := act(s)
		if err != nil {
			return err
		}
		if reason.Kind == "" {
			return fmt.Errorf("finishing session %s without a reason", id)
		}
		rows, err := tx.Query(ctx, `UPDATE sessions SET status = $2, failure_reason = $3, finished_at = $4,
			end_kind = $5, end_actor = $6 WHERE id = $1 RETURNING `+columns,
			id, string(reason.Status()), reason.Detail, at, string(reason.Kind), string(reason.Actor))
		if err != nil {
			return err
		}
		if s, err = pgx.CollectExactlyOneRow(rows, scanSession); err != nil {
			return err
		}
		ok = true
		return nil
	})
	return s, ok, err
}

// GetSettled implements session.Store: SELECT … FOR SHARE waits for any
// FinishIf holding the row lock, and the transaction ends at once.
func (p *PG) GetSettled(ctx context.Context, id string) (s session.Session, err error) {
	err = pgx.BeginFunc(ctx, p.conns, func(tx pgx.Tx) error {
		s, err = lockRow(ctx, tx, id, "FOR SHARE")
		return err
	})
	return s, err
}

// lockRow reads one session row in tx with the row lock mode ("FOR
// UPDATE", "FOR SHARE"), waiting for any holder; ErrNoSession if none.
func lockRow(ctx context.Context, tx pgx.Tx, id, mode string) (session.Session, error) {
	return one(tx.Query(ctx, `SELECT `+columns+` FROM sessions WHERE id = $1 `+mode, id))
}

// one collects exactly one session from a query's result; ErrNoSession if
// it has no row.
func one(rows pgx.Rows, err error) (session.Session, error) {
	if err != nil {
		return session.Session{}, err
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanSession)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, session.ErrNoSession
	}
	return s, err
}

func (p *PG) update(ctx context.Context, id, sql string, args ...any) (session.Session, error) {
	s, err := p.queryOne(ctx, sql, args...)
	if !errors.Is(err, session.ErrNoSession) {
		return s, err
	}
	cur, err := p.Get(ctx, id)
	if err != nil {
		return cur, err
	}
	return cur, fmt.Errorf("%w: session %s is %s", session.ErrNotLive, id, cur.Status)
}

// LockCapacity implements session.Store with the advisory lock "capacity".
func (p *PG) LockCapacity(ctx context.Context) (func(), error) {
	return p.Lock(ctx, "capacity")
}

// Lock blocks until it holds the database-wide advisory lock called name
// (e.g. "capacity"), on one of the lock connections. unlock releases it;
// if the process dies the database releases it with the connection.
// Neither the holder nor the waiters use the main connections while waiting, so
// they can never starve the holder's or anyone else's queries.
func (p *PG) Lock(ctx context.Context, name string) (unlock func(), err error) {
	conn, err := p.locks.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	key := lockKey(p.env, name)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		// The lock may have been granted as the wait was cancelled; never
		// return a connection that might hold it to the pool.
		conn.Conn().Close(context.Background())
		conn.Release()
		return nil, fmt.Errorf("advisory lock %s: %w", name, err)
	}
	return releaser(conn, key), nil
}

// TryLock takes the advisory lock called name if it is free and reports
// whether it did; the reaper uses it so a second concurrent run returns
// "busy" instead of waiting. unlock is nil when ok is false.
func (p *PG) TryLock(ctx context.Context, name string) (unlock func(), ok bool, err error) {
	conn, err := p.tryLocks.Acquire(ctx)
	if err != nil {
		return nil, false, err
	}
	key := lockKey(p.env, name)
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil {
		conn.Conn().Close(context.Background())
		conn.Release()
		return nil, false, fmt.Errorf("advisory lock %s: %w", name, err)
	}
	if !ok {
		conn.Release()
		return nil, false, nil
	}
	return releaser(conn, key), true, nil
}

func releaser(conn *pgxpool.Conn, key int64) func() {
	done := false
	return func() {
		if done {
			return
		}
		done = true
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var released bool
		if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&released); err != nil || !released {
			// Dropping the connection releases every lock it holds.
			conn.Conn().Close(ctx)
		}
		conn.Release()
	}
}

// lockKey maps a lock name to the 64-bit key PostgreSQL advisory locks
// use, namespaced so other applications sharing the database don't
// collide, and by environment, so two environments never share a capacity
// or reaper lock even on one database. An empty env is the database-wide
// namespace, for the schema migrations only: they must exclude everyone.
// (A label value, env never contains the separator ':'.)
func lockKey(env, name string) int64 {
	if env != "" {
		name = env + ":" + name
	}
	h := fnv.New64a()
	h.Write([]byte("labkeep:" + name))
	return int64(h.Sum64())
}

func (p *PG) queryOne(ctx context.Context, sql string, args ...any) (session.Session, error) {
	return one(p.conns.Query(ctx, sql, args...))
}

func scanSession(row pgx.CollectableRow) (session.Session, error) {
	var s session.Session
	var kind, status, endKind, endActor string
	var readyAt, finishedAt *time.Time
	var nodes []byte
	var id [16]byte
	var pool string
	var claimedFor *[16]byte
	var reservation *int64
	err := row.Scan(&id, &s.Student, &s.Lab, &kind, &status, &s.StartedAt, &s.ExpiresAt, &s.MaxExpiresAt,
		&readyAt, &finishedAt, &nodes, &s.End.Detail, &s.GradingToken, &endKind, &endActor, &s.StudentKey, &s.HostKey,
		&pool, &claimedFor, &s.Home, &reservation)
	if err != nil {
		return s, err
	}
	if reservation != nil {
		s.Reservation = *reservation
	}
	s.ID = formatUUID(id)
	s.Pool = session.PoolState(pool)
	if claimedFor != nil {
		s.ClaimedFor = formatUUID(*claimedFor)
	}
	s.Kind, s.Status = labs.Kind(kind), session.Status(status)
	s.End.Kind, s.End.Actor = session.EndKind(endKind), session.Actor(endActor)
	s.Window = lifetime.Window{StartedAt: s.StartedAt.UTC(), ExpiresAt: s.ExpiresAt.UTC(), MaxExpiresAt: s.MaxExpiresAt.UTC()}
	if readyAt != nil {
		s.ReadyAt = readyAt.UTC()
	}
	if finishedAt != nil {
		s.FinishedAt = finishedAt.UTC()
	}
	if err := json.Unmarshal(nodes, &s.Nodes); err != nil {
		return s, fmt.Errorf("session %s nodes: %w", s.ID, err)
	}
	return s, nil
}

func formatUUID(b [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// nullID is id, or NULL for 0 (none).
func nullID(id int64) *int64 {
	if id == 0 {
		return nil
	}
	return &id
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func nullUUID(id string) *string {
	if id == "" {
		return nil
	}
	return &id
}

func nonNil(n []session.Node) []session.Node {
	if n == nil {
		return []session.Node{}
	}
	return n
}
