// Package pgtest starts a throwaway PostgreSQL server from the machine's
// server binaries (initdb, pg_ctl, postgres) for tests and `make run`, so
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
)

// Server is a running throwaway PostgreSQL. The zero value is not usable;
// call Start.
type Server struct {
	// DSN connects as the superuser to the "labkeep" database.
	DSN string

	dir      string
	data     string
	external bool
	runAs    *syscall.Credential
	stopOnce sync.Once
	stopErr  error
}

// Start initialises and starts a new cluster in a fresh temp dir under
// tmpRoot ("" for the system default). If externalDSN is non-empty nothing
// is started and that DSN is returned as is (DATABASE_URL in CI setups that
// bring their own server). As root, the server runs as the "postgres" user,
// because postgres refuses to run as root.
func Start(ctx context.Context, tmpRoot, externalDSN string) (*Server, error) {
	if externalDSN != "" {
		return &Server{DSN: externalDSN, external: true}, nil
	}
	for _, bin := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("pgtest: %s not in PATH (install PostgreSQL server binaries): %w", bin, err)
		}
	}
	dir, err := os.MkdirTemp(tmpRoot, "labkeep-pg-")
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
	opts := fmt.Sprintf("-c listen_addresses='' -c unix_socket_directories='%s' -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200", dir)
	if err := s.run(ctx, "pg_ctl", "-D", s.data, "-l", filepath.Join(dir, "log"), "-o", opts, "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		s.cleanup()
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	if err := s.createDatabase(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	s.DSN = fmt.Sprintf("postgres://postgres@/labkeep?host=%s&sslmode=disable", url.QueryEscape(dir))
	return s, nil
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
		s.stopErr = s.run(context.Background(), "pg_ctl", "-D", s.data, "-m", "immediate", "-w", "-t", "30", "stop")
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
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if s.runAs != nil {
		cmd.SysProcAttr.Credential = s.runAs
		cmd.Env = append(os.Environ(), "HOME="+s.dir)
	}
	cmd.Dir = s.dir
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pgtest: %s: %w: %s", filepath.Base(cmd.Path), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// createDatabase makes the "labkeep" database with the createdb that sits
// beside pg_ctl (only initdb, pg_ctl and postgres are linked into PATH).
func (s *Server) createDatabase(ctx context.Context) error {
	pgctl, _ := exec.LookPath("pg_ctl")
	if real, err := filepath.EvalSymlinks(pgctl); err == nil {
		pgctl = real
	}
	createdb := filepath.Join(filepath.Dir(pgctl), "createdb")
	if _, err := os.Stat(createdb); err != nil {
		return errors.New("pgtest: createdb not found next to pg_ctl")
	}
	cmd := exec.CommandContext(ctx, createdb, "-h", s.dir, "-U", "postgres", "labkeep")
	return s.exec(cmd)
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
