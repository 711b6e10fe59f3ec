package podlab_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"labkeep/localrun/stacktest"
	"labkeep/shared/terminal"
)

// The web terminal is the way back in when SSH is not: a shell in the
// student's real workspace container through the API server's pods/exec
// (kubelet → containerd), over a WebSocket the portal opens, and the
// cleanup button asking the Pod's guardian to kill everything
// unprotected. Only the session's own student reaches either.
func TestWebTerminal(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{})
	s := openLab(t, d, "tara", "shell", nil)
	s.waitRunning(3 * time.Minute)
	s.waitSSH(time.Minute)
	id := s.opened.ID

	t.Run("id and ps in the workspace container", func(t *testing.T) {
		tm := dialTerminal(t, d, id, d.Token("tara", "student"), nil)
		conn := tm.waitConnected()
		if conn.Object != s.podName() || conn.Kind != "pod" {
			t.Errorf("connected to %s %s, want pod %s", conn.Kind, conn.Object, s.podName())
		}
		tm.send("id; echo in-$LABKEEP_CONTAINER_NAME; ps -eo pid,comm\n")
		out := tm.waitOutput("in-workspace", "uid=0(root) gid=0(root)", "sshd", "guardian")
		tm.resize(113, 37)
		// Quoted so that the terminal's echo of the typed line holds
		// neither marker: only the shell's output does.
		tm.send("stty size; echo shell\"\"-pid-$$\".\"end\n")
		out = tm.waitOutput("37 113", ".end")
		t.Logf("terminal output of id and ps (the Pod shares its PID namespace, so guardian shows too):\n%s", lastLines(out, 12))
		// Leaving the page hangs the shell up, as a dropped SSH connection
		// does: it does not linger in the container.
		pid := between(out, "shell-pid-", ".end")
		tm.close()
		closed := time.Now()
		stacktest.Eventually(t, time.Minute, func() (bool, string) {
			out := strings.TrimSpace(s.mustRun("test -d /proc/" + pid + " && echo running || echo gone"))
			return out == "gone", "the terminal's shell " + pid + " is " + out
		})
		t.Logf("the terminal's shell (pid %s) ended %s after its socket closed", pid, time.Since(closed).Round(10*time.Millisecond))
	})

	t.Run("sshd refusing logins", func(t *testing.T) {
		// The student locks themself out: sshd runs but refuses every key.
		tm := dialTerminal(t, d, id, d.Token("tara", "student"), nil)
		tm.waitConnected()
		tm.send("mv /run/sshd/authorized_keys /root/keys.saved && echo moved-$((6*7))\n")
		tm.waitOutput("moved-42")
		tm.close()
		if _, err := s.run("true", nil); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
			t.Fatalf("ssh with the keys moved away: %v, want an authentication failure", err)
		}
		// A new WebSocket is a new shell: the way back in, and the repair.
		tm = dialTerminal(t, d, id, d.Token("tara", "student"), nil)
		defer tm.close()
		tm.waitConnected()
		tm.send("id; mv /root/keys.saved /run/sshd/authorized_keys && echo restored-$((6*7))\n")
		tm.waitOutput("uid=0(root)", "restored-42")
		if out := s.mustRun("echo ssh-ok"); out != "ssh-ok\n" {
			t.Errorf("ssh after the repair: %q", out)
		}
	})

	t.Run("sshd killed", func(t *testing.T) {
		before := status(s.pod(), "workspace")
		tm := dialTerminal(t, d, id, d.Token("tara", "student"), nil)
		tm.waitConnected()
		killed := time.Now()
		// sshd is the container's main process: the container ends, and the
		// terminal's shell with it.
		tm.send("kill -9 $(pgrep -o -x sshd)\n")
		end := tm.waitEnd()
		t.Logf("the terminal's shell ended with the container: %s", end)
		tm.close()
		// A new connection opens a new exec as soon as the kubelet has
		// started the container again; until then the exec is refused and
		// the socket says why.
		var refused []string
		var tm2 *term
		stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
			c := dialTerminal(t, d, id, d.Token("tara", "student"), nil)
			if msg := c.waitConnectedOrEnd(); msg.Type != "connected" {
				refused = append(refused, msg.Error)
				c.close()
				return false, fmt.Sprintf("exec refused: %s; Pod: %s", msg.Error, s.podState())
			}
			tm2 = c
			return true, ""
		})
		defer tm2.close()
		tm2.send("id\n")
		tm2.waitOutput("uid=0(root)")
		back := time.Since(killed)
		// The kubelet reports the new container in the Pod's status a
		// little after it runs.
		stacktest.Eventually(t, time.Minute, func() (bool, string) {
			after := status(s.pod(), "workspace")
			return after.RestartCount == before.RestartCount+1 && containerID(after) != containerID(before),
				fmt.Sprintf("workspace container: %d restarts (was %d), id %s", after.RestartCount, before.RestartCount, containerID(after))
		})
		t.Logf("sshd killed → the terminal works again after %s (%d connection attempts refused while the container restarted, e.g. %q)",
			back.Round(10*time.Millisecond), len(refused), first(refused))
		s.waitSSH(2 * time.Minute)
	})

	t.Run("cleanup kills a CPU hog and SSH works after", func(t *testing.T) {
		s := s.in(t)
		s.mustRun(`for i in 1 2 3 4 5 6; do setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & done`)
		hogs := pids(t, s.mustRun(`sleep 1; pgrep -f 'while :; do :; d[o]ne'`))
		if len(hogs) != 6 {
			t.Fatalf("hogs running: %v, want 6", hogs)
		}
		r := d.Do("POST", "/terminal/cleanup", d.Token("tara", "student"), fmt.Sprintf(`{"session":%q}`, id), "")
		if r.Status != http.StatusOK {
			t.Fatalf("cleanup = %d %s", r.Status, r.Body)
		}
		var rep terminal.CleanupReport
		if err := json.Unmarshal(r.Body, &rep); err != nil {
			t.Fatal(err)
		}
		for _, p := range hogs {
			if !slices.Contains(rep.Killed, p) {
				t.Errorf("hog %d not in the cleanup's killed %v", p, rep.Killed)
			}
		}
		if rep.Session != id || rep.Failed != 0 {
			t.Errorf("cleanup report %+v, want session %s and nothing failed", rep, id)
		}
		out := s.mustRun(`pgrep -f 'while :; do :; d[o]ne' | wc -l`)
		if strings.TrimSpace(out) != "0" {
			t.Errorf("hogs left after the cleanup: %s", out)
		}
		t.Logf("cleanup: killed %d processes %v (the 6 hogs %v among them), failed %d, note %q; SSH works after it",
			len(rep.Killed), rep.Killed, hogs, rep.Failed, rep.Note)
	})

	t.Run("another student is refused", func(t *testing.T) {
		other := d.Token("victor", "student")
		r := d.Do("POST", "/terminal/cleanup", other, fmt.Sprintf(`{"session":%q}`, id), "")
		if r.Status != http.StatusForbidden || r.Code != "forbidden" {
			t.Errorf("another student's cleanup = %d %s, want 403 forbidden", r.Status, r.Body)
		}
		// By URL: a client that sends the Authorization header with the
		// upgrade is refused before it.
		if status, body := upgrade(t, d, id, http.Header{"Authorization": {"Bearer " + other}}); status != http.StatusForbidden {
			t.Errorf("another student's upgrade = %d %s, want 403", status, body)
		}
		// By WebSocket: the token in the first message.
		tm := dialTerminal(t, d, id, other, nil)
		if code, reason := tm.closed(); code != 4403 || !strings.HasPrefix(reason, "forbidden") {
			t.Errorf("another student's terminal closed %d %q, want 4403 forbidden", code, reason)
		}
		// A page of another site, with the student's own token.
		if status, body := upgrade(t, d, id, http.Header{"Origin": {"https://evil.example"}, "Authorization": {"Bearer " + d.Token("tara", "student")}}); status != http.StatusForbidden {
			t.Errorf("upgrade from another origin = %d %s, want 403", status, body)
		}
		tm = dialTerminal(t, d, id, "not-a-token", nil)
		if code, _ := tm.closed(); code != 4401 {
			t.Errorf("terminal with a bad token closed %d, want 4401", code)
		}
		// The student's own cleanup of nothing still works (the rule refuses
		// only others).
		if r := d.Do("POST", "/terminal/cleanup", d.Token("tara", "student"), fmt.Sprintf(`{"session":%q}`, id), ""); r.Status != http.StatusOK {
			t.Errorf("own cleanup = %d %s", r.Status, r.Body)
		}
	})
	// Another environment shares the sessions namespace, and its database
	// holds a running session naming this one's Pod (the same id: a copy
	// of the row, as a restored backup or a tampered database would). Its
	// terminal and cleanup must not reach into a Pod its environment does
	// not own: both are refused before any exec or guardian call.
	t.Run("another environment's record reaches nothing", func(t *testing.T) {
		other := stacktest.Deploy(t, st, stacktest.Options{Namespace: d.Namespace})
		var row []byte
		if err := d.DB.QueryRow(t.Context(), `SELECT row_to_json(s) FROM sessions s WHERE id = $1`, id).Scan(&row); err != nil {
			t.Fatal(err)
		}
		if _, err := other.DB.Exec(t.Context(), `INSERT INTO sessions SELECT * FROM json_populate_record(NULL::sessions, $1)`, row); err != nil {
			t.Fatal(err)
		}
		if _, err := other.DB.Exec(t.Context(), `UPDATE sessions SET student = 'mallory' WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		mallory := other.Token("mallory", "student")
		if r := other.Do("GET", "/getSession?id="+id, mallory, "", ""); r.Status != http.StatusOK {
			t.Fatalf("the copied session in the other environment = %d %s, want it mallory's and running", r.Status, r.Body)
		}
		tm := dialTerminal(t, other, id, mallory, nil)
		wantWhy := "forbidden: workspace Pod " + s.podName() + " is not this session's here"
		if code, why := tm.closed(); code != 4403 || !strings.HasPrefix(why, wantWhy) {
			t.Errorf("the other environment's terminal closed %d %q, want 4403 %q…", code, why, wantWhy)
		}
		if r := other.Do("POST", "/terminal/cleanup", mallory, fmt.Sprintf(`{"session":%q}`, id), ""); r.Status != http.StatusForbidden || r.Code != "forbidden" {
			t.Errorf("the other environment's cleanup = %d %s, want 403 forbidden", r.Status, r.Body)
		}
		// Control: this environment's student still gets her terminal.
		own := dialTerminal(t, d, id, d.Token("tara", "student"), nil)
		defer own.close()
		own.waitConnected()
	})
}

// term is one terminal WebSocket as the portal's page holds it.
type term struct {
	t testing.TB
	c *websocket.Conn

	mu    sync.Mutex
	out   bytes.Buffer
	ctrl  []termMsg
	code  websocket.StatusCode
	why   string
	ended chan struct{}
}

// termMsg is a control message from the server.
type termMsg struct {
	Type     string `json:"type"`
	Session  string `json:"session"`
	Kind     string `json:"kind"`
	Object   string `json:"object"`
	Error    string `json:"error"`
	ExitCode *int   `json:"exitCode"`
}

func (m termMsg) String() string {
	code := "none"
	if m.ExitCode != nil {
		code = strconv.Itoa(*m.ExitCode)
	}
	return fmt.Sprintf("%s (exit code %s, error %q)", m.Type, code, m.Error)
}

// dialTerminal opens the terminal of session id as the portal's page does
// (Origin the server's own) and sends token as the first message.
func dialTerminal(t testing.TB, d *stacktest.Deployment, id, token string, h http.Header) *term {
	t.Helper()
	if h == nil {
		h = http.Header{}
	}
	h.Set("Origin", d.URL)
	c, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(d.URL, "http")+"/terminal/connect?session="+id,
		&websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatalf("dial the terminal: %v", err)
	}
	tm := &term{t: t, c: c, ended: make(chan struct{})}
	if token != "" {
		b, _ := json.Marshal(map[string]string{"token": token})
		if err := c.Write(context.Background(), websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
	}
	go func() {
		defer close(tm.ended)
		for {
			typ, b, err := c.Read(context.Background())
			tm.mu.Lock()
			if err != nil {
				tm.code = websocket.CloseStatus(err)
				var ce websocket.CloseError
				if errors.As(err, &ce) {
					tm.why = ce.Reason
				}
				tm.mu.Unlock()
				return
			}
			if typ == websocket.MessageBinary {
				tm.out.Write(b)
			} else {
				var m termMsg
				_ = json.Unmarshal(b, &m)
				tm.ctrl = append(tm.ctrl, m)
			}
			tm.mu.Unlock()
		}
	}()
	return tm
}

// upgrade tries the WebSocket upgrade with header h and returns the HTTP
// answer when it is refused (status 101 when it is not).
func upgrade(t testing.TB, d *stacktest.Deployment, id string, h http.Header) (int, string) {
	t.Helper()
	c, resp, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(d.URL, "http")+"/terminal/connect?session="+id,
		&websocket.DialOptions{HTTPHeader: h})
	if err == nil {
		c.CloseNow()
		return http.StatusSwitchingProtocols, ""
	}
	if resp == nil {
		t.Fatalf("upgrade: %v", err)
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	return resp.StatusCode, body.String()
}

func (tm *term) send(s string) {
	tm.t.Helper()
	if err := tm.c.Write(context.Background(), websocket.MessageBinary, []byte(s)); err != nil {
		tm.t.Fatalf("typing %q: %v", s, err)
	}
}

func (tm *term) resize(cols, rows int) {
	tm.t.Helper()
	b := []byte(fmt.Sprintf(`{"type":"resize","cols":%d,"rows":%d}`, cols, rows))
	if err := tm.c.Write(context.Background(), websocket.MessageText, b); err != nil {
		tm.t.Fatal(err)
	}
}

func (tm *term) close() { tm.c.CloseNow() }

// msgs are the control messages so far and whether the socket has closed.
func (tm *term) msgs() ([]termMsg, string) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	select {
	case <-tm.ended:
		return slices.Clone(tm.ctrl), fmt.Sprintf("closed %d %q", tm.code, tm.why)
	default:
		return slices.Clone(tm.ctrl), ""
	}
}

// waitConnectedOrEnd returns the first control message: connected, or
// the exit of a stream that never came up.
func (tm *term) waitConnectedOrEnd() termMsg {
	tm.t.Helper()
	var got termMsg
	stacktest.Eventually(tm.t, time.Minute, func() (bool, string) {
		ms, closed := tm.msgs()
		if len(ms) > 0 {
			got = ms[0]
			return true, ""
		}
		if closed != "" {
			got = termMsg{Type: "exit", Error: closed}
			return true, ""
		}
		return false, "no control message yet"
	})
	return got
}

// waitConnected waits for the stream to be up.
func (tm *term) waitConnected() termMsg {
	tm.t.Helper()
	m := tm.waitConnectedOrEnd()
	if m.Type != "connected" {
		tm.t.Fatalf("terminal did not connect: %+v", m)
	}
	return m
}

// waitEnd waits for the exit message.
func (tm *term) waitEnd() termMsg {
	tm.t.Helper()
	var got termMsg
	stacktest.Eventually(tm.t, time.Minute, func() (bool, string) {
		ms, closed := tm.msgs()
		for _, m := range ms {
			if m.Type == "exit" {
				got = m
				return true, ""
			}
		}
		return closed != "", "no exit yet"
	})
	return got
}

// waitOutput waits until the output holds every one of subs and returns it.
func (tm *term) waitOutput(subs ...string) string {
	tm.t.Helper()
	var out string
	stacktest.Eventually(tm.t, 30*time.Second, func() (bool, string) {
		tm.mu.Lock()
		out = tm.out.String()
		tm.mu.Unlock()
		for _, s := range subs {
			if !strings.Contains(out, s) {
				_, closed := tm.msgs()
				return false, fmt.Sprintf("no %q in the output %s:\n%s", s, closed, lastLines(out, 10))
			}
		}
		return true, ""
	})
	return out
}

// closed waits for the socket to close and returns its close code and
// reason.
func (tm *term) closed() (websocket.StatusCode, string) {
	tm.t.Helper()
	select {
	case <-tm.ended:
	case <-time.After(30 * time.Second):
		tm.t.Fatal("the terminal stayed open")
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.code, tm.why
}

// pids parses whitespace-separated PIDs.
func pids(t testing.TB, s string) []int {
	t.Helper()
	var out []int
	for _, f := range strings.Fields(s) {
		p, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("not a PID: %q in %q", f, s)
		}
		out = append(out, p)
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\r\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// between is the text of s after the last start and before the next end
// (the last: a terminal echoes the command before its output).
func between(s, start, end string) string {
	rest := s[strings.LastIndex(s, start)+len(start):]
	v, _, _ := strings.Cut(rest, end)
	return v
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}
