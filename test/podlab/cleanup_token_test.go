package podlab_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"labkeep/localrun/stacktest"
	"labkeep/shared/workspacekey"
)

// A workspace's root can always impersonate its own guardian: kill it,
// hold its port (9090) in the Pod's network namespace while the kubelet
// restarts it, and answer the functions' cleanup call (fakeguardian, a
// static binary copied in over SSH). What the functions send it must be
// worth nothing anywhere else, and nothing it answers may send them on:
//   - the token it receives is its own session's (the one in its own
//     Secret), and another session's guardian, asked from this host (the
//     platform's source range) with it, answers 401; the same call with
//     that session's own token is accepted, so the 401 is the token's;
//   - a redirect it answers (307 to a server this test runs, reachable
//     from the functions) is never followed: that server receives no
//     request and the student's cleanup answers 502 bad_gateway.
func TestFakeGuardianGainsNothing(t *testing.T) {
	// Two workspaces share the node's two CPUs.
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: `labs:
- name: shell
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  nodes: [{role: workspace, cpu: 300m, memory: 512Mi}]
`})
	fake := stacktest.BuildStatic(t, "labkeep/test/podlab/fakeguardian")
	mallory := openLab(t, d, "mallory", "shell", nil)
	victim := openLab(t, d, "victor", "shell", nil)
	mallory.waitRunning(3 * time.Minute)
	victim.waitRunning(3 * time.Minute)
	mallory.waitSSH(time.Minute)
	victim.waitSSH(time.Minute)
	id, victimID := mallory.opened.ID, victim.opened.ID
	key := d.App.Config.WorkspaceKey()

	// Root kills guardian and holds its port. guardian, restarted by the
	// kubelet, takes its port back once it guards the workspace again (it
	// kills the process holding it, guard.ListenAPI), so root takes it
	// again whenever a cleanup reached guardian instead, as an attacker
	// would: what is asserted is what fakeguardian gets and answers.
	mallory.upload(fake, "/usr/local/bin/fakeguardian")
	takePort := func(t *testing.T) {
		t.Helper()
		if out, err := mallory.in(t).run(`pkill -x fakeguardian; pkill -9 -x guardian; rm -f /tmp/fakeguardian.log; setsid fakeguardian </dev/null >/tmp/fakeguardian.log 2>&1 & `+
			`for i in $(seq 300); do grep -q listening /tmp/fakeguardian.log && break; sleep 0.1; done; cat /tmp/fakeguardian.log`, nil); err != nil ||
			!strings.Contains(out, "listening") {
			t.Fatalf("fakeguardian did not take guardian's port: %v %q", err, out)
		}
		stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
			code, body, err := guardianAPI(mallory.pod(), "/whoami")
			return err == nil && code == http.StatusOK && strings.TrimSpace(string(body)) == "fakeguardian",
				fmt.Sprintf("port 9090 of the workspace answers %d %q (%v)", code, body, err)
		})
	}
	takePort(t)
	t.Cleanup(func() { _, _ = mallory.run("pkill -x fakeguardian", nil) })
	records := func(t *testing.T) int {
		t.Helper()
		out, err := mallory.in(t).run("cat /tmp/fakeguardian.auth 2>/dev/null | wc -l", nil)
		if err != nil {
			t.Fatalf("%v %s", err, out)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	// cleanup is mallory's cleanup call as fakeguardian received it.
	cleanup := func(t *testing.T) stacktest.Response {
		t.Helper()
		for attempt := 1; ; attempt++ {
			before := records(t)
			r := d.Do("POST", "/terminal/cleanup", d.Token("mallory", "student"), fmt.Sprintf(`{"session":%q}`, id), "")
			if records(t) > before {
				return r
			}
			if attempt == 5 {
				t.Fatalf("guardian had taken its port back before each of %d cleanups (the last answered %d %s)", attempt, r.Status, r.Body)
			}
			t.Logf("guardian had taken its port back: cleanup %d answered by it (%d %s); taking the port again", attempt, r.Status, r.Body)
			takePort(t)
		}
	}

	t.Run("the token it receives opens no other guardian", func(t *testing.T) {
		if r := cleanup(t); r.Status != http.StatusOK {
			t.Fatalf("cleanup answered by fakeguardian = %d %s, want its 200", r.Status, r.Body)
		}
		out, err := mallory.in(t).run("cat /tmp/fakeguardian.auth; cat /etc/labkeep/guardian-cleanup-token", nil)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "Bearer ") {
			t.Fatalf("fakeguardian recorded %q, want one bearer token (then the Secret's token)", out)
		}
		stolen := strings.TrimPrefix(lines[0], "Bearer ")
		// The token is the session's own: the one its Secret holds, which
		// its root could read anyway.
		if stolen != key.Token(workspacekey.Cleanup, id) || stolen != lines[1] {
			t.Errorf("token received %q, want session %s's own (its Secret holds %q)", stolen, id, lines[1])
		}
		pod := victim.pod()
		tests := []struct {
			name, token string
			want        int
		}{
			{"the stolen token", stolen, http.StatusUnauthorized},
			{"the victim's own token", key.Token(workspacekey.Cleanup, victimID), http.StatusOK},
		}
		for _, tt := range tests {
			code, body := guardianCleanup(t, pod.Status.PodIP, tt.token)
			if code != tt.want {
				t.Errorf("%s against session %s's guardian: %d %s, want %d", tt.name, victimID, code, body, tt.want)
			}
		}
	})

	t.Run("its redirect is not followed", func(t *testing.T) {
		var reached atomic.Int32
		target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached.Add(1)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintln(w, `{"killed":[],"failed":0}`)
		}))
		defer target.Close()
		if out, err := mallory.in(t).run(fmt.Sprintf("echo %s/cleanup > /tmp/fakeguardian.redirect", target.URL), nil); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		r := cleanup(t)
		if r.Status != http.StatusBadGateway || !strings.Contains(string(r.Body), "bad_gateway") {
			t.Errorf("cleanup redirected by fakeguardian = %d %s, want 502 bad_gateway", r.Status, r.Body)
		}
		if n := reached.Load(); n != 0 {
			t.Errorf("the redirect's target received %d requests, want none", n)
		}
		out, _ := mallory.in(t).run("wc -l < /tmp/fakeguardian.auth", nil)
		t.Logf("fakeguardian answered 2 cleanups (records: %s); the redirect answered %d %s", strings.TrimSpace(out), r.Status, r.Body)
	})
}

// guardianCleanup posts /cleanup with token to the guardian at ip, from
// this host (a platform source range), and returns its answer.
func guardianCleanup(t *testing.T, ip, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+net.JoinHostPort(ip, "9090")+"/cleanup", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST /cleanup to %s: %v", ip, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, strings.TrimSpace(string(b))
}
