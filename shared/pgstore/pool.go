package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Option changes how Open connects.
type Option func(*pgxpool.Config)

// MaxConns sets the main pool's size (the connections student calls use);
// n ≤ 0 keeps the DSN's pool_max_conns, or pgxpool's default (the larger
// of 4 and the number of CPUs) if it names none.
func MaxConns(n int) Option {
	return func(c *pgxpool.Config) {
		if n > 0 {
			c.MaxConns = int32(n)
		}
	}
}

// WithPool returns a store on the same database, environment and lock
// pools as p but with a main pool of its own of at most conns connections.
// The reaper runs on one: however many of its workers wait for the
// database, or hold a connection through a slow teardown, they can never
// take a connection a student's call needs. Close it with ClosePool (Close
// would also close the lock pools it shares with p).
func (p *PG) WithPool(ctx context.Context, conns int) (*PG, error) {
	if conns < 1 {
		return nil, fmt.Errorf("database pool of %d connections: at least 1 is needed", conns)
	}
	cfg := p.pool.Config().Copy()
	cfg.MaxConns, cfg.MinConns = int32(conns), 0
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	own := *p
	own.pool = pool
	return &own, nil
}

// ClosePool closes the main pool only: for a store made by WithPool.
func (p *PG) ClosePool() { p.pool.Close() }
