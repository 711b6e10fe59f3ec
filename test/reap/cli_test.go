package reap_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// cliResult is one run of the labkeep command.
type cliResult struct {
	code           int
	stdout, stderr string
}

// buildCLI builds functions/cmd/labkeep, the binary an operator runs.
func buildCLI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "labkeep")
	if out, err := exec.Command("go", "build", "-o", bin, "labkeep/functions/cmd/labkeep").CombinedOutput(); err != nil {
		t.Fatalf("go build labkeep: %v\n%s", err, out)
	}
	return bin
}

// runCLI runs bin with args against url as token.
func runCLI(t *testing.T, bin, url, token string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "LABKEEP_URL="+url, "LABKEEP_ADMIN_TOKEN="+token)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := cliResult{stdout: out.String(), stderr: errb.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("labkeep %v: %v", args, err)
	}
	return r
}

// The labkeep CLI against the deployed handler: it lists the live
// sessions, closes one by ID, runs the reaper dry (the namespace and the
// rows stay as they were) and refuses bad input with a clear message.
func TestLabkeepCLI(t *testing.T) {
	bin := buildCLI(t)
	h := newBackend(t, stacktest.Options{})
	closing := h.open("s-cli-close", "linux-vm")
	expiring := h.open("s-cli-expire", "linux-vm")
	cli := func(args ...string) cliResult {
		t.Helper()
		return runCLI(t, bin, h.Server.URL, h.Token("ops", "admin"), args...)
	}

	r := cli("admin", "sessions")
	if r.code != 0 || !strings.Contains(r.stdout, closing.ID) || !strings.Contains(r.stdout, expiring.ID) {
		t.Fatalf("admin sessions: exit %d, want both sessions listed:\n%s%s", r.code, r.stdout, r.stderr)
	}

	if r = cli("admin", "close", closing.ID); r.code != 0 {
		t.Fatalf("admin close: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got := h.status(closing.ID); got != session.StatusClosed {
		t.Fatalf("after admin close the session is %s, want %s", got, session.StatusClosed)
	}
	h.WaitGone(closing.ID)

	h.Clock.Advance(61 * time.Minute)
	before, runsBefore := h.everything(), h.Count("SELECT count(*) FROM reap_runs")
	r = cli("admin", "reap", "--dry-run")
	var report struct {
		DryRun bool           `json:"dryRun"`
		Counts map[string]int `json:"counts"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &report); r.code != 0 || err != nil || !report.DryRun || report.Counts["expired"] != 1 {
		t.Fatalf("admin reap --dry-run: exit %d, want a dry report of 1 expired (%v):\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if diff := cmp.Diff(before, h.everything()); diff != "" {
		t.Fatalf("admin reap --dry-run changed the namespace (-before +after):\n%s", diff)
	}
	if got := h.status(expiring.ID); got != session.StatusRunning {
		t.Fatalf("after the dry run the expired session is %s, want still %s", got, session.StatusRunning)
	}
	if n := h.Count("SELECT count(*) FROM reap_runs"); n != runsBefore+1 {
		t.Errorf("the dry run recorded %d runs, want 1", n-runsBefore)
	}

	if r = cli("admin", "status"); r.code != 0 || !json.Valid([]byte(r.stdout)) {
		t.Errorf("admin status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	bad := []struct {
		name   string
		token  string
		args   []string
		code   int
		stderr string
	}{
		{"an ID that is no live session", "", []string{"admin", "close", "no-such-session"}, 1, `no live session "no-such-session"`},
		{"a student's token", h.Token("s-cli-expire", "student"), []string{"admin", "sessions"}, 1, "403 Forbidden forbidden"},
		{"an unknown flag", "", []string{"admin", "reap", "--force"}, 2, "reap takes only --dry-run"},
		{"an unknown command", "", []string{"admin", "delete-everything"}, 2, `unknown command "delete-everything"`},
		{"close without an ID", "", []string{"admin", "close"}, 2, "close takes one session ID"},
	}
	for _, tc := range bad {
		token := tc.token
		if token == "" {
			token = h.Token("ops", "admin")
		}
		r := runCLI(t, bin, h.Server.URL, token, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.stderr) {
			t.Errorf("%s: exit %d %q, want exit %d with %q", tc.name, r.code, r.stderr, tc.code, tc.stderr)
		}
	}
	if r := runCLI(t, bin, "", "x", "admin", "status"); r.code != 1 || !strings.Contains(r.stderr, "LABKEEP_URL is not set") {
		t.Errorf("without LABKEEP_URL: exit %d %q", r.code, r.stderr)
	}
	if diff := cmp.Diff(before, h.everything()); diff != "" {
		t.Fatalf("bad command lines changed the namespace (-before +after):\n%s", diff)
	}
	if got := h.status(expiring.ID); got != session.StatusRunning {
		t.Fatalf("after the bad command lines the session is %s", got)
	}
}
