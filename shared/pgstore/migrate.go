package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrate applies every embedded migration not yet recorded in
// schema_migrations, each in its own transaction, under an advisory lock so
// instances starting together don't race, and then records env as the
// database's environment: the environment table's one row is written if
// missing and must name env. A database another environment recorded is
// refused before any migration is applied to it.
func migrate(ctx context.Context, conns *pgxpool.Pool, env string) error {
	conn, err := conns.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey("", "migrate")); err != nil {
		conn.Conn().Close(ctx)
		return fmt.Errorf("migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey("", "migrate"))
	if err := checkEnvironment(ctx, conn.Conn(), env, false); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		version := strings.TrimSuffix(strings.TrimPrefix(name, "migrations/"), ".sql")
		var done bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)", version).Scan(&done); err != nil {
			return err
		}
		if done {
			continue
		}
		sql, err := migrations.ReadFile(name)
		if err != nil {
			return err
		}
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version) VALUES ($1)", version)
			return err
		}); err != nil {
			return fmt.Errorf("migration %s: %w", version, err)
		}
	}
	return checkEnvironment(ctx, conn.Conn(), env, true)
}

// checkEnvironment compares env with the environment the database records
// (none yet, or no environment table yet, passes); with record, it first
// records env if none is recorded. Call it under the migration lock.
func checkEnvironment(ctx context.Context, conn *pgx.Conn, env string, record bool) error {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('environment') IS NOT NULL").Scan(&exists); err != nil || !exists {
		return err
	}
	if record {
		if _, err := conn.Exec(ctx, "INSERT INTO environment (env) VALUES ($1) ON CONFLICT (one) DO NOTHING", env); err != nil {
			return fmt.Errorf("recording the database's environment: %w", err)
		}
	}
	var owner string
	err := conn.QueryRow(ctx, "SELECT env FROM environment").Scan(&owner)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("reading the database's environment: %w", err)
	case owner != env:
		return fmt.Errorf("%w: it is environment %q's database and this labkeep is environment %q; "+
			"give this labkeep %q's own database (or, if this deployment is %q's, set its environment to %q)",
			ErrOtherEnvironment, owner, env, env, owner, owner)
	}
	return nil
}
