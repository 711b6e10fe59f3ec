package podlab_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"labkeep/localrun/stacktest"
	"labkeep/shared/termlimit"
)

// The web terminal's bounds on the real node, each terminal a real exec
// stream into the student's workspace container: a student opening
// terminals in a loop is refused past their cap while the earlier ones
// keep working; a terminal nobody types into closes after the idle
// timeout while one typed into stays; and a terminal closes within
// seconds of its session ending — its time up with its Pod still running
// (no reaper has run), or the student closing it — saying why.
func TestTerminalLimits(t *testing.T) {
	const idle = 20 * time.Second
	d := stacktest.Deploy(t, st, stacktest.Options{TerminalIdle: idle})
	s := openLab(t, d, "lena", "shell", nil)
	s.waitRunning(3 * time.Minute)
	id := s.opened.ID

	t.Run("past the student's cap", func(t *testing.T) {
		tok := d.Token("lena", "student")
		var open []*term
		defer func() {
			for _, tm := range open {
				tm.close()
			}
		}()
		for i := range termlimit.DefaultPerStudent + 2 {
			tm := dialTerminal(t, d, id, tok, nil)
			if i < termlimit.DefaultPerStudent {
				tm.waitConnected()
				open = append(open, tm)
				continue
			}
			code, reason := tm.closed()
			if code != 4429 || !strings.HasPrefix(reason, "too_many_terminals: ") {
				t.Errorf("terminal %d closed %d %q, want 4429 too_many_terminals", i+1, code, reason)
			}
			t.Logf("terminal %d refused: %d %q", i+1, code, reason)
		}
		// A client sending Authorization with the upgrade gets an
		// ordinary 429.
		res := upgradeAnswer(t, d, id, http.Header{"Authorization": {"Bearer " + tok}})
		if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" || !strings.Contains(res.Body, `"too_many_terminals"`) {
			t.Errorf("upgrade past the cap = %d (Retry-After %q) %s, want 429 too_many_terminals with Retry-After",
				res.StatusCode, res.Header.Get("Retry-After"), res.Body)
		}
		// The earlier terminals still work.
		for i, tm := range open {
			tm.send(fmt.Sprintf("echo still-$((%d*7))-here\n", i+1))
			tm.waitOutput(fmt.Sprintf("still-%d-here", (i+1)*7))
		}
		// Leaving one makes room for the next.
		open[0].close()
		open = open[1:]
		next := dialWhenFree(t, d, id)
		open = append(open, next)
		next.send("echo room-$((6*7))\n")
		next.waitOutput("room-42")
	})

	t.Run("idle", func(t *testing.T) {
		start := time.Now() // before either opens: a lower bound of their time open
		quiet := dialWhenFree(t, d, id)
		defer quiet.close()
		busy := dialWhenFree(t, d, id)
		defer busy.close()
		quiet.send("echo typed-once\n")
		quiet.waitOutput("typed-once")
		stop := make(chan struct{})
		typed := make(chan struct{})
		go func() {
			defer close(typed)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(3 * time.Second):
					_ = busy.c.Write(context.Background(), websocket.MessageBinary, []byte(fmt.Sprintf("echo k%d\n", i)))
				}
			}
		}()
		code, reason := waitClosed(t, quiet, idle+30*time.Second)
		took := time.Since(start)
		close(stop)
		<-typed
		if code != websocket.StatusNormalClosure || !strings.HasPrefix(reason, "idle: ") {
			t.Errorf("idle terminal closed %d %q, want 1000 idle", code, reason)
		}
		if end := quiet.waitEnd(); !strings.HasPrefix(end.Error, "idle: ") {
			t.Errorf("idle terminal's exit %s, want its error to start with idle", end)
		}
		if took < idle {
			t.Errorf("idle terminal closed %s after it opened, before the idle timeout %s", took, idle)
		}
		if _, closed := busy.msgs(); closed != "" {
			t.Errorf("the terminal typed into %s", closed)
		}
		busy.send("echo busy-$((6*7))\n")
		busy.waitOutput("busy-42")
		t.Logf("the idle terminal closed %s after it opened (idle timeout %s): %d %q; the one typed into every 3s stayed open",
			took.Round(100*time.Millisecond), idle, code, reason)
	})

	t.Run("its session's time up", func(t *testing.T) {
		tm := dialWhenFree(t, d, id)
		defer tm.close()
		tm.send("echo before-expiry\n")
		tm.waitOutput("before-expiry")
		// The session's time runs out: the functions' clock moves past its
		// expiry. No reaper runs here, so its Pod keeps running and its
		// exec stream with it: only the terminal's own re-read ends it.
		_, v := s.get()
		d.Clock.Advance(time.Until(v.ExpiresAt) + time.Minute)
		expired := time.Now()
		code, reason := waitClosed(t, tm, 3*termlimit.DefaultRecheck)
		took := time.Since(expired)
		if code != 4403 || !strings.Contains(reason, "has ended (expired)") {
			t.Errorf("terminal of an expired session closed %d %q, want 4403 ... has ended (expired)", code, reason)
		}
		if end := tm.waitEnd(); !strings.Contains(end.Error, "has ended (expired)") {
			t.Errorf("terminal of an expired session: exit %s, want its error to say the session has ended", end)
		}
		if s.pod() == nil {
			t.Error("the workspace Pod is gone: the close did not come from the terminal's re-read")
		}
		t.Logf("the terminal closed %s after its session's time ran out (re-read every %s), its Pod still running: %d %q",
			took.Round(100*time.Millisecond), termlimit.DefaultRecheck, code, reason)
		s.close()
	})

	t.Run("its session closed by the student", func(t *testing.T) {
		s := openLab(t, d, "lena", "shell", nil)
		s.waitRunning(3 * time.Minute)
		tm := dialWhenFree(t, d, s.opened.ID)
		defer tm.close()
		tm.send("echo before-close\n")
		tm.waitOutput("before-close")
		closing := time.Now()
		s.close()
		code, reason := waitClosed(t, tm, 3*termlimit.DefaultRecheck)
		end := tm.waitEnd()
		// The Pod's deletion may end the shell first (the close deletes,
		// then marks the row in the same transaction); either way the
		// student is told their session ended, not only that a shell
		// exited.
		if code != 4403 || !strings.Contains(reason, "has ended (closed)") || !strings.Contains(end.Error, "has ended (closed)") {
			t.Errorf("terminal of a closed session closed %d %q, exit %s; want 4403 ... has ended (closed), the exit saying so", code, reason, end)
		}
		t.Logf("the terminal closed %s after closeSession was called: %d %q, exit %s",
			time.Since(closing).Round(100*time.Millisecond), code, reason, end)
	})
}

// dialWhenFree opens a terminal of session id for lena, again while it is
// refused past the cap (a terminal just left gives its place back once its
// shell has been hung up), and waits for it to connect.
func dialWhenFree(t *testing.T, d *stacktest.Deployment, id string) *term {
	t.Helper()
	var tm *term
	stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
		c := dialTerminal(t, d, id, d.Token("lena", "student"), nil)
		if m := c.waitConnectedOrEnd(); m.Type != "connected" {
			c.close()
			return false, "refused: " + m.Error
		}
		tm = c
		return true, ""
	})
	return tm
}

// waitClosed waits up to within for tm's socket to close and returns its
// close code and reason.
func waitClosed(t *testing.T, tm *term, within time.Duration) (websocket.StatusCode, string) {
	t.Helper()
	select {
	case <-tm.ended:
	case <-time.After(within):
		t.Fatalf("the terminal is still open after %s", within)
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.code, tm.why
}

// upgradeResult is the HTTP answer to a refused upgrade.
type upgradeResult struct {
	StatusCode int
	Header     http.Header
	Body       string
}

// upgradeAnswer tries the WebSocket upgrade with header h and returns the
// answer (status 101 when it is not refused).
func upgradeAnswer(t *testing.T, d *stacktest.Deployment, id string, h http.Header) upgradeResult {
	t.Helper()
	c, res, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(d.URL, "http")+"/terminal/connect?session="+id,
		&websocket.DialOptions{HTTPHeader: h})
	if err == nil {
		c.CloseNow()
		return upgradeResult{StatusCode: http.StatusSwitchingProtocols}
	}
	if res == nil {
		t.Fatalf("upgrade: %v", err)
	}
	var body strings.Builder
	buf := make([]byte, 4096)
	for {
		n, rerr := res.Body.Read(buf)
		body.Write(buf[:n])
		if rerr != nil {
			break
		}
	}
	return upgradeResult{StatusCode: res.StatusCode, Header: res.Header, Body: body.String()}
}
