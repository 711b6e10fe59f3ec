// Package pgtest starts a throwaway PostgreSQL server from the machine's
// server binaries (initdb, postgres) for tests and `make run`, so
// labkeep is exercised against the real database it runs on in production.
// The server listens only on a unix socket in its own temp dir (no port to
// collide with), and Stop removes every file it made.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"labkeep/localrun/childproc"
)

// Server is a running throwaway PostgreSQL. The zero value is not usable;
// call Start.
type Server struct {
	// DSN connects as the superuser to the "labkeep" database.
	DSN string

	dir      string
	data     string
	external bool
	proc     *childproc.Process
	runAs    *syscall.Credential
	stopOnce sync.Once
	stopErr  error
}

// Start initialises (initdb) and starts a new cluster in a fresh temp dir under
// tmpRoot ("" for the system default). If externalDSN is non-empty nothing
// is started and that DSN is returned as is (DATABASE_URL in CI setups that
// bring their own server). As root, the server runs as the "postgres" user,
// because postgres refuses to run as root.
func Start(ctx context.Context, tmpRoot, externalDSN string) (*Server, error) {
	if externalDSN != "" {
		return &Server{DSN: externalDSN, external: true}, nil
	}
	for _, bin := range []string{"initdb", "postgres"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("pgtest: %s not in PATH (install PostgreSQL server binaries): %w", bin, err)
		}
	}
	childproc.SweepStale(tmpRoot, "labkeep-pg")
	dir, err := childproc.TempDir(tmpRoot, "labkeep-pg")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, data: filepath.Join(dir, "data")}
	if os.Geteuid() == 0 {
		cred, err := postgresUser()
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s.runAs = cred
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		// The temp root (e.g. /tmp/x) must be traversable by postgres.
		_ = os.Chmod(dir, 0o700)
	}
	if err := s.run(ctx, "initdb", "-D", s.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		s.cleanup()
		return nil, err
	}
	// postgres runs as our direct child (not daemonised by pg_ctl) so that
	// it dies with us even on SIGKILL; see package childproc.
	pgbin, err := exec.LookPath("postgres")
	if err != nil {
		s.cleanup()
		return nil, err
	}
	s.proc, err = childproc.Start("postgres", filepath.Join(dir, "log"), childproc.Attr{Credential: s.runAs, Env: s.env(), Dir: dir},
		pgbin, "-D", s.data, "-c", "listen_addresses=", "-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off", "-c", "max_connections=200")
	if err != nil {
		s.cleanup()
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.createDatabase(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	s.DSN = fmt.Sprintf("postgres://postgres@/labkeep?host=%s&sslmode=disable", url.QueryEscape(dir))
	return s, nil
}

// Pid is the postmaster's process id (0 for an external server).
func (s *Server) Pid() int {
	if s.proc == nil {
		return 0
	}
	return s.proc.Pid()
}

// Dir is the server's temp dir (socket, data, log); empty for an external
// server. Tests use it to check that Stop left nothing behind.
func (s *Server) Dir() string { return s.dir }

// Stop shuts the server down immediately and removes its directory. It is
// safe to call more than once; an external server is left untouched.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if s.external {
			return
		}
		// SIGQUIT is PostgreSQL's immediate shutdown: a throwaway database
		// needs no checkpoint.
		s.proc.Stop(syscall.SIGQUIT, 10*time.Second)
		if done, err := s.proc.Exited(); done && err != nil && !isSignalExit(err) {
			s.stopErr = fmt.Errorf("pgtest: postgres: %w", err)
		}
		s.cleanup()
	})
	return s.stopErr
}

func (s *Server) cleanup() {
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// run executes one of the server binaries, as the postgres user when root.
func (s *Server) run(ctx context.Context, name string, args ...string) error {
	return s.exec(exec.CommandContext(ctx, name, args...))
}

func (s *Server) exec(cmd *exec.Cmd) error {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.runAs}
	cmd.Env = s.env()
	cmd.Dir = s.dir
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgtest: %s: %w: %s", filepath.Base(cmd.Path), err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (s *Server) env() []string {
	if s.runAs == nil {
		return nil
	}
	return append(os.Environ(), "HOME="+s.dir)
}

// waitReady polls the socket with pg_isready's protocol-free check: the
// server is ready once a connection to "postgres" succeeds.
func (s *Server) waitReady(ctx context.Context) error {
	dsn := fmt.Sprintf("postgres://postgres@/postgres?host=%s&sslmode=disable&connect_timeout=2", url.QueryEscape(s.dir))
	deadline := time.Now().Add(60 * time.Second)
	for {
		if done, err := s.proc.Exited(); done {
			return fmt.Errorf("pgtest: postgres %w (%v): %s", childproc.ErrExited, err, s.proc.LogTail(2000))
		}
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("pgtest: postgres not ready: %w: %s", err, s.proc.LogTail(2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func isSignalExit(err error) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			return ws.Signaled() || ws.ExitStatus() == 0
		}
	}
	return false
}

// createDatabase makes the "labkeep" database.
func (s *Server) createDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@/postgres?host=%s&sslmode=disable", url.QueryEscape(s.dir)))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE labkeep")
	return err
}

func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root needs a 'postgres' user to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
