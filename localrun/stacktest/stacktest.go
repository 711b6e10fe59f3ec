// Package stacktest is the set-up integration test packages share: one local
// stack per test binary (started in TestMain, stopped on exit or Ctrl-C), a
// fresh database per test, and a settable clock to inject into the
// functions and the reaper so expiry is tested without sleeping.
package stacktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"labkeep/localrun/stack"
)

// Main starts a stack with opts for the test binary, stores it in *st, runs
// the tests and exits with their code. The stack uses DATABASE_URL's
// PostgreSQL when that is set (a CI setup that brings its own), and stops
// on SIGINT/SIGTERM too, so an interrupted run leaves nothing behind.
func Main(m *testing.M, st **stack.Stack, opts stack.Options) {
	opts.StopOnSignal = true
	if opts.DatabaseURL == "" {
		opts.DatabaseURL = os.Getenv("DATABASE_URL")
	}
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	if opts.VirtSim.Logger == nil {
		opts.VirtSim.Logger = Logger()
	}
	s, err := stack.Start(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stack:", err)
		os.Exit(1)
	}
	*st = s
	code := m.Run()
	s.Stop()
	os.Exit(code)
}

// Logger is what tests hand to the code under test: warnings and errors on
// stderr, everything when LABKEEP_TEST_VERBOSE is set.
func Logger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("LABKEEP_TEST_VERBOSE") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// Discard is a logger that drops everything.
func Discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Suffix returns 8 random hex characters, for names that must not collide
// between tests sharing a stack.
func Suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// CreateDatabase creates a new database on st's server, named after prefix
// and a random suffix, and returns its DSN with the given pool size.
func CreateDatabase(t testing.TB, st *stack.Stack, prefix string, poolMaxConns int) string {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, st.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	name := strings.ReplaceAll(prefix, "-", "_") + "_" + Suffix()
	if _, err := pool.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(st.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	q := u.Query()
	q.Set("pool_max_conns", fmt.Sprint(poolMaxConns))
	u.RawQuery = q.Encode()
	return u.String()
}

// Clock is an injectable clock: real time shifted by Advance, or frozen at
// a set instant. The zero value is real time. Safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	off    time.Duration
	frozen time.Time
}

// Now is the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen.IsZero() {
		return c.frozen
	}
	return time.Now().Add(c.off)
}

// Advance moves the clock forward by d (a frozen clock stays frozen, d later).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen.IsZero() {
		c.frozen = c.frozen.Add(d)
		return
	}
	c.off += d
}

// Set freezes the clock at t; the zero time unfreezes it (real time again,
// still shifted by earlier Advances).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = t
}
