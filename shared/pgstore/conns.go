package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Option changes how Open connects.
type Option func(*pgxpool.Config)

// MaxConns sets the main connections' number (those student calls use);
// n ≤ 0 keeps the DSN's pool_max_conns, or pgxpool's default (the larger
// of 4 and the number of CPUs) if it names none.
func MaxConns(n int) Option {
	return func(c *pgxpool.Config) {
		if n > 0 {
			c.MaxConns = int32(n)
		}
	}
}

// WithConns returns a store on the same database, environment and lock
// connections as p but with main connections of its own, at most n. The
// reaper runs on one: however many of its workers wait for the database,
// or hold a connection through a slow teardown, they can never take a
// connection a student's call needs. Close it with CloseConns (Close
// would also close the lock connections it shares with p).
func (p *PG) WithConns(ctx context.Context, n int) (*PG, error) {
	if n < 1 {
		return nil, fmt.Errorf("database connections: %d, at least 1 is needed", n)
	}
	cfg := p.conns.Config().Copy()
	cfg.MaxConns, cfg.MinConns = int32(n), 0
	conns, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	own := *p
	own.conns = conns
	return &own, nil
}

// CloseConns closes the main connections only: for a store made by
// WithConns.
func (p *PG) CloseConns() { p.conns.Close() }
