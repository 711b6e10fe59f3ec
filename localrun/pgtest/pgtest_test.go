package pgtest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The throwaway PostgreSQL accepts a pgx connection and is
// gone after stop.
func TestStartConnectStop(t *testing.T) {
	ctx := context.Background()
	s, err := Start(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	conn, err := pgx.Connect(ctx, s.DSN)
	if err != nil {
		t.Fatalf("connect %s: %v", s.DSN, err)
	}
	var got int
	if err := conn.QueryRow(ctx, "select 40 + 2").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != 42 {
		t.Fatalf("select 40+2 = %d", got)
	}
	var db string
	if err := conn.QueryRow(ctx, "select current_database()").Scan(&db); err != nil || db != "labkeep" {
		t.Fatalf("current_database = %q, %v", db, err)
	}
	conn.Close(ctx)

	dir := s.Dir()
	if err := s.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("server dir %s still exists after Stop (err=%v)", dir, err)
	}
	if _, err := pgx.Connect(ctx, s.DSN); err == nil {
		t.Fatal("connect succeeded after Stop")
	}
}

func TestExternalDSNStartsNothing(t *testing.T) {
	s, err := Start(context.Background(), "", "postgres://example/db")
	if err != nil {
		t.Fatal(err)
	}
	if s.DSN != "postgres://example/db" || s.Dir() != "" {
		t.Fatalf("got DSN %q dir %q", s.DSN, s.Dir())
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
}
