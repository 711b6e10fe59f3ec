// Command labkeep is the operator's client of a deployed labkeep, over the
// same HTTP API the admin console uses:
//
//	labkeep admin sessions          every live session (GET /adminSessions)
//	labkeep admin reap [--dry-run]  a reaper run now (POST /adminReapNow);
//	                                --dry-run reports and deletes nothing
//	labkeep admin close ID          close live session ID (POST /closeSession
//	                                for its student)
//	labkeep admin status            the reaper's status (GET /adminStatus)
//
// LABKEEP_URL (the functions' base URL) and LABKEEP_ADMIN_TOKEN (an admin
// JWT) come from the environment; `make run` writes both into its
// functions.env. Answers are printed as indented JSON (sessions as a
// table); an HTTP error is printed with its status, code and message and
// exits 1; a usage error exits 2.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// config is the command's one settings struct (LABKEEP_URL,
// LABKEEP_ADMIN_TOKEN).
type config struct {
	URL        string        `envconfig:"URL"`
	AdminToken string        `split_words:"true"`
	Timeout    time.Duration `default:"2m"` // LABKEEP_TIMEOUT: a reaper run may take its whole deadline
}

const usage = `usage:
  labkeep admin sessions          list every live session
  labkeep admin reap [--dry-run]  run the reaper now (--dry-run: delete nothing)
  labkeep admin close ID          close live session ID
  labkeep admin status            the reaper's status
settings: LABKEEP_URL (e.g. http://localhost:8080), LABKEEP_ADMIN_TOKEN (an admin JWT)`

// errUsage is a command line the command cannot run; it exits 2.
var errUsage = errors.New("usage")

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout)
	switch {
	case err == nil:
	case errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "labkeep: %v\n%s\n", err, usage)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "labkeep:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) < 2 || args[0] != "admin" {
		return fmt.Errorf("%w: want `labkeep admin COMMAND`, got %q", errUsage, strings.Join(args, " "))
	}
	cmd, rest := args[1], args[2:]
	var cfg config
	if err := envconfig.Process("labkeep", &cfg); err != nil {
		return err
	}
	c, err := newClient(cfg)
	if err != nil {
		return err
	}
	switch cmd {
	case "sessions":
		if len(rest) != 0 {
			return fmt.Errorf("%w: sessions takes no arguments, got %q", errUsage, rest)
		}
		return c.sessions(ctx, out)
	case "reap":
		fs := flag.NewFlagSet("reap", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		dry := fs.Bool("dry-run", false, "report what the run would delete and delete nothing")
		if err := fs.Parse(rest); err != nil || fs.NArg() != 0 {
			return fmt.Errorf("%w: reap takes only --dry-run, got %q", errUsage, rest)
		}
		body, _ := json.Marshal(map[string]bool{"dryRun": *dry})
		return c.print(ctx, out, http.MethodPost, "/adminReapNow", body)
	case "close":
		if len(rest) != 1 || rest[0] == "" {
			return fmt.Errorf("%w: close takes one session ID, got %q", errUsage, rest)
		}
		return c.close(ctx, out, rest[0])
	case "status":
		if len(rest) != 0 {
			return fmt.Errorf("%w: status takes no arguments, got %q", errUsage, rest)
		}
		return c.print(ctx, out, http.MethodGet, "/adminStatus", nil)
	default:
		return fmt.Errorf("%w: unknown command %q", errUsage, cmd)
	}
}

// client calls one labkeep deployment as an admin.
type client struct {
	base  string
	token string
	http  *http.Client
}

func newClient(cfg config) (*client, error) {
	if cfg.URL == "" {
		return nil, errors.New("LABKEEP_URL is not set (the functions' base URL; `make run` writes it into its functions.env)")
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("LABKEEP_URL %q is not an http(s) URL", cfg.URL)
	}
	if cfg.AdminToken == "" {
		return nil, errors.New("LABKEEP_ADMIN_TOKEN is not set (an admin JWT; `make run` writes one into its functions.env)")
	}
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("LABKEEP_TIMEOUT must be positive, got %s", cfg.Timeout)
	}
	return &client{base: strings.TrimRight(cfg.URL, "/"), token: cfg.AdminToken, http: &http.Client{Timeout: cfg.Timeout}}, nil
}

// call sends one request and returns the 2xx answer's body; any other
// answer is an error carrying its status and labkeep's error code and
// message.
func (c *client) call(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if res.StatusCode/100 != 2 {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code != "" {
			return nil, fmt.Errorf("%s %s: %s %s: %s", method, path, res.Status, e.Error.Code, e.Error.Message)
		}
		return nil, fmt.Errorf("%s %s: %s: %s", method, path, res.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

// print calls and prints the JSON answer indented.
func (c *client) print(ctx context.Context, out io.Writer, method, path string, body []byte) error {
	b, err := c.call(ctx, method, path, body)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return fmt.Errorf("%s %s: the answer is not JSON: %w", method, path, err)
	}
	buf.WriteByte('\n')
	_, err = out.Write(buf.Bytes())
	return err
}

// liveSession is what the command reads of an adminSessions entry.
type liveSession struct {
	ID        string    `json:"id"`
	Student   string    `json:"student"`
	Lab       string    `json:"lab"`
	Status    string    `json:"status"`
	ExpiresAt time.Time `json:"expiresAt"`
	Alerts    int       `json:"alerts"`
}

func (c *client) live(ctx context.Context) ([]liveSession, error) {
	b, err := c.call(ctx, http.MethodGet, "/adminSessions", nil)
	if err != nil {
		return nil, err
	}
	var list struct {
		Sessions []liveSession `json:"sessions"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("GET /adminSessions: %w", err)
	}
	return list.Sessions, nil
}

func (c *client) sessions(ctx context.Context, out io.Writer) error {
	live, err := c.live(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTUDENT\tLAB\tSTATUS\tEXPIRES\tALERTS")
	for _, s := range live {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", s.ID, s.Student, s.Lab, s.Status, s.ExpiresAt.UTC().Format(time.RFC3339), s.Alerts)
	}
	return tw.Flush()
}

// close closes live session id: closeSession acts for a student, so the
// session's student is looked up among the live sessions first.
func (c *client) close(ctx context.Context, out io.Writer, id string) error {
	live, err := c.live(ctx)
	if err != nil {
		return err
	}
	for _, s := range live {
		if s.ID == id {
			body, _ := json.Marshal(map[string]string{"student": s.Student, "id": id})
			return c.print(ctx, out, http.MethodPost, "/closeSession", body)
		}
	}
	return fmt.Errorf("no live session %q (labkeep admin sessions lists them)", id)
}
