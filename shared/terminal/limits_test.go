package terminal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/shared/access"
	"labkeep/shared/httpapi"
	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/line"
	"labkeep/shared/session"
	"labkeep/shared/termlimit"
)

// A re-read of an open terminal's session closes it once the session is
// no longer live or no longer the student's, in Reach's words; a live
// session, running or not, and a failed read keep it open.
func TestEnded(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	window := lifetime.Window{StartedAt: now.Add(-time.Minute), ExpiresAt: now.Add(time.Hour), MaxExpiresAt: now.Add(3 * time.Hour)}
	with := func(status session.Status, w lifetime.Window) session.Standing {
		return session.Standing{Session: &session.Session{ID: "s-1", Status: status, Window: w}}
	}
	expired := window
	expired.ExpiresAt = now.Add(-time.Second)
	tests := []struct {
		name     string
		standing session.Standing
		err      error
		want     error
		wantText string
	}{
		{"running: stays open", with(session.StatusRunning, window), nil, nil, ""},
		{"live, not running (provisioning): stays open", with(session.StatusProvisioning, window), nil, nil, ""},
		{"the read failed: stays open until a read says otherwise", session.Standing{}, errors.New("database unreachable"), nil, ""},
		{"closed by the student", with(session.StatusClosed, window), nil, access.ErrForbidden, "session s-1 has ended (closed)"},
		{"reaped as a ghost", with(session.StatusFailed, window), nil, access.ErrForbidden, "session s-1 has ended (failed)"},
		{"past its expiry, not yet reaped", with(session.StatusRunning, expired), nil, access.ErrForbidden, "session s-1 has ended (expired)"},
		{"no longer the student's", session.Standing{}, session.ErrNoSession, access.ErrForbidden, "session s-1 is no longer a session of yours"},
		{"a place in the line instead", session.Standing{Waiting: &line.Waiting{ID: "s-1"}}, nil, access.ErrForbidden, "session s-1 is no longer running"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Ended("s-1", tc.standing, tc.err, now)
			if !errors.Is(got, tc.want) || (tc.want == nil) != (got == nil) {
				t.Fatalf("Ended = %v, want %v", got, tc.want)
			}
			if got != nil && !strings.Contains(got.Error(), tc.wantText) {
				t.Errorf("Ended = %q, want it to say %q", got, tc.wantText)
			}
		})
	}
}

// rig is a Handler over fakes: sessions it can end, an executor whose
// shell echoes its input until its stdin closes, and a server to dial.
type rig struct {
	t        *testing.T
	srv      *httptest.Server
	h        *Handler
	sessions *liveSessions
	secret   []byte
	now      func() time.Time
	// execs counts the pods/exec calls made.
	execs atomic.Int32
}

// liveSessions is a Sessions whose sessions' statuses a test changes.
type liveSessions struct {
	mu sync.Mutex
	by map[string]session.Session
}

func (l *liveSessions) Get(_ context.Context, student, id string) (session.Standing, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.by[id]
	if !ok || s.Student != student {
		return session.Standing{}, session.ErrNoSession
	}
	return session.Standing{Session: &s}, nil
}

func (l *liveSessions) set(id string, status session.Status) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.by[id]
	s.Status = status
	l.by[id] = s
}

// echoShell is a pods/exec stream: a prompt, then its input echoed back,
// until its input closes (the socket went) or ctx ends. Any other command
// (the hang-up) succeeds at once.
type echoShell struct{ command []string }

func (e echoShell) Stream(o remotecommand.StreamOptions) error {
	return e.StreamWithContext(context.Background(), o)
}

func (e echoShell) StreamWithContext(ctx context.Context, o remotecommand.StreamOptions) error {
	if o.Stdin == nil {
		return nil
	}
	_, _ = o.Stdout.Write([]byte("$ "))
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(o.Stdout, o.Stdin)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func newRig(t *testing.T, limits termlimit.Limits) *rig {
	t.Helper()
	secret := []byte("terminal-test-secret-0123456789abcdef")
	now := time.Now
	auth := access.NewAuthenticator(secret, now)
	window := lifetime.Window{StartedAt: now().Add(-time.Minute), ExpiresAt: now().Add(time.Hour), MaxExpiresAt: now().Add(3 * time.Hour)}
	sessions := &liveSessions{by: map[string]session.Session{}}
	owners := objectOwners{}
	for _, who := range []string{"ann", "bob", "eve"} {
		id := "s-" + who
		sessions.by[id] = session.Session{ID: id, Student: who, Kind: labs.KindPod, Status: session.StatusRunning,
			Window: window, Nodes: []session.Node{{Name: "ws"}}}
		owners[session.NodeName(id, "ws")] = id
	}
	// eve's session names a Pod another environment's session owns.
	owners[session.NodeName("s-eve", "ws")] = "s-other-env"
	r := &rig{t: t, sessions: sessions, secret: secret, now: now}
	h, err := New(Options{
		Sessions: sessions, Auth: auth, API: httpapi.New(httpapi.Options{Auth: auth, Now: now}),
		Kube: &rest.Config{Host: "http://127.0.0.1:1"}, Namespace: "s", Now: now, Limits: limits, Owners: owners,
		Exec: func(_ *rest.Config, _ kubernetes.Interface, _, _ string, o corev1.PodExecOptions) (remotecommand.Executor, error) {
			r.execs.Add(1)
			return echoShell{command: o.Command}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	r.h, r.srv = h, httptest.NewServer(h)
	t.Cleanup(r.srv.Close)
	return r
}

// objectOwners is the cluster as Owners sees it: each object's session
// (its labkeep.io/session in this environment).
type objectOwners map[string]string

func (o objectOwners) Owns(_ context.Context, _ labs.Kind, name, sessionID string) error {
	if o[name] != sessionID {
		return fmt.Errorf("%w: workspace Pod %s is not this session's here (this is %s)", access.ErrForbidden, name, sessionID)
	}
	return nil
}

func (r *rig) token(student string) string {
	r.t.Helper()
	tok, err := access.DefaultTokenRules().Issue(r.secret, student, access.RoleStudent, r.now())
	if err != nil {
		r.t.Fatal(err)
	}
	return tok
}

// socket is one dialled terminal and everything it received.
type socket struct {
	t    *testing.T
	c    *websocket.Conn
	done chan struct{}

	mu     sync.Mutex
	out    strings.Builder
	ctrl   []control
	code   websocket.StatusCode
	reason string
}

// dial opens the terminal of student's session as the page does, sending
// token as the first message unless it is empty.
func (r *rig) dial(student, token string) *socket {
	r.t.Helper()
	c, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(r.srv.URL, "http")+"/terminal/connect?session=s-"+student, nil)
	if err != nil {
		r.t.Fatalf("dial: %v", err)
	}
	s := &socket{t: r.t, c: c, done: make(chan struct{})}
	if token != "" {
		b, _ := json.Marshal(control{Token: token})
		if err := c.Write(context.Background(), websocket.MessageText, b); err != nil {
			r.t.Fatal(err)
		}
	}
	go func() {
		defer close(s.done)
		for {
			typ, b, err := c.Read(context.Background())
			s.mu.Lock()
			if err != nil {
				s.code = websocket.CloseStatus(err)
				var ce websocket.CloseError
				if errors.As(err, &ce) {
					s.reason = ce.Reason
				}
				s.mu.Unlock()
				return
			}
			if typ == websocket.MessageBinary {
				s.out.Write(b)
			} else {
				var m control
				_ = json.Unmarshal(b, &m)
				s.ctrl = append(s.ctrl, m)
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// connected waits for the shell's prompt.
func (s *socket) connected() {
	s.t.Helper()
	s.waitOutput("$ ")
}

func (s *socket) waitOutput(sub string) {
	s.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		out := s.out.String()
		s.mu.Unlock()
		if strings.Contains(out, sub) {
			return
		}
		select {
		case <-s.done:
			s.t.Fatalf("closed %d %q before %q appeared (output %q)", s.code, s.reason, sub, out)
		case <-time.After(5 * time.Millisecond):
		}
	}
	s.t.Fatalf("no %q in the output", sub)
}

func (s *socket) send(text string) {
	s.t.Helper()
	if err := s.c.Write(context.Background(), websocket.MessageBinary, []byte(text)); err != nil {
		s.t.Fatalf("typing: %v", err)
	}
}

// ending is how a socket closed: its code, its reason and the error of
// its last exit message.
type ending struct {
	Code      websocket.StatusCode
	Reason    string
	ExitError string
}

// closed waits up to within for the socket to close.
func (s *socket) closed(within time.Duration) ending {
	s.t.Helper()
	select {
	case <-s.done:
	case <-time.After(within):
		s.t.Fatalf("still open after %s", within)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := ending{Code: s.code, Reason: s.reason}
	for _, m := range s.ctrl {
		if m.Type == "exit" {
			e.ExitError = m.Error
		}
	}
	return e
}

// open reports whether the socket is still open after d.
func (s *socket) open(d time.Duration) bool {
	select {
	case <-s.done:
		return false
	case <-time.After(d):
		return true
	}
}

// A session whose object the cluster says is not its own (another
// environment's, sharing the namespace) gets no terminal: the socket closes
// 4403 with the reason, and nothing is ever executed in that Pod.
func TestNoTerminalIntoAnotherSessionsObject(t *testing.T) {
	r := newRig(t, termlimit.DefaultLimits())
	got := r.dial("eve", r.token("eve")).closed(5 * time.Second)
	want := ending{Code: 4403, Reason: "forbidden: workspace Pod " + session.NodeName("s-eve", "ws") + " is not this session's here (this is s-eve)"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("eve's terminal (-want +got):\n%s", diff)
	}
	if n := r.execs.Load(); n != 0 {
		t.Errorf("%d execs into the other session's Pod, want none", n)
	}
	r.dial("ann", r.token("ann")).connected() // control: her own Pod opens
	if n := r.execs.Load(); n != 1 {
		t.Errorf("%d execs after ann's terminal, want 1", n)
	}
}

// A student opens terminals up to their cap; the next is refused with
// 4429 too_many_terminals (before the upgrade: 429 with Retry-After) while
// the earlier ones keep working, and closing one makes room. Another
// student is not held to the first one's cap.
func TestPerStudentCap(t *testing.T) {
	limits := termlimit.DefaultLimits()
	limits.PerStudent = 2
	r := newRig(t, limits)
	var open []*socket
	for range limits.PerStudent {
		s := r.dial("ann", r.token("ann"))
		s.connected()
		open = append(open, s)
	}
	refused := r.dial("ann", r.token("ann")).closed(5 * time.Second)
	want := ending{Code: 4429, Reason: "too_many_terminals: you have 2 terminals open, the most a student may; close one first"}
	if diff := cmp.Diff(want, refused); diff != "" {
		t.Errorf("the terminal past the cap (-want +got):\n%s", diff)
	}
	req, _ := http.NewRequest("GET", r.srv.URL+"/terminal/connect?session=s-ann", nil)
	req.Header.Set("Authorization", "Bearer "+r.token("ann"))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.NewDecoder(res.Body).Decode(&body)
	res.Body.Close()
	type answer struct {
		Status           int
		Code, RetryAfter string
	}
	if diff := cmp.Diff(answer{429, "too_many_terminals", "30"}, answer{res.StatusCode, body.Error.Code, res.Header.Get("Retry-After")}); diff != "" {
		t.Errorf("the upgrade past the cap with Authorization (-want +got):\n%s", diff)
	}
	for i, s := range open {
		s.send("still-here\n")
		s.waitOutput("still-here")
		if !s.open(0) {
			t.Errorf("terminal %d closed", i)
		}
	}
	r.dial("bob", r.token("bob")).connected()
	open[0].c.Close(websocket.StatusNormalClosure, "")
	waitCounts(t, r.h, func(c termlimit.Counts) bool { return c.ByStudent["ann"] == 1 })
	r.dial("ann", r.token("ann")).connected()
}

// waitCounts waits until the handler's ledger satisfies ok.
func waitCounts(t *testing.T, h *Handler, ok func(termlimit.Counts) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok(h.ledger.Counts()) {
		if time.Now().After(deadline) {
			t.Fatalf("counts %+v", h.ledger.Counts())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Sockets that send no token hold the process's places until the auth
// timeout, no more of them than its cap: the next socket is refused 4429
// at once, and each silent one is dropped when its time is up (no close
// frame: a client that never speaks is owed nothing more), its place free
// again.
func TestPendingSocketsCountAgainstTheProcess(t *testing.T) {
	limits := termlimit.DefaultLimits()
	limits.PerProcess, limits.AuthTimeout = 3, 500*time.Millisecond
	r := newRig(t, limits)
	var silent []*socket
	for range limits.PerProcess {
		silent = append(silent, r.dial("ann", ""))
	}
	waitCounts(t, r.h, func(c termlimit.Counts) bool { return c.Pending == limits.PerProcess })
	start := time.Now()
	refused := r.dial("bob", r.token("bob")).closed(time.Second)
	if refused.Code != 4429 || !strings.HasPrefix(refused.Reason, "too_many_terminals: this server holds 3 terminals") {
		t.Errorf("a socket past the process's cap closed %d %q, want 4429 too_many_terminals", refused.Code, refused.Reason)
	}
	if waited := time.Since(start); waited > limits.AuthTimeout {
		t.Errorf("the refusal took %s, longer than the auth timeout", waited)
	}
	for _, s := range silent {
		s.closed(limits.AuthTimeout + time.Second)
	}
	if waited := time.Since(start); waited < limits.AuthTimeout-100*time.Millisecond {
		t.Errorf("silent sockets dropped after %s, before the auth timeout", waited)
	}
	waitCounts(t, r.h, func(c termlimit.Counts) bool { return c.Pending == 0 })
	r.dial("bob", r.token("bob")).connected()
}

// An open terminal closes on its own bounds, saying why in its exit
// message and close reason: no input for Idle (input keeps it open),
// MaxLifetime whatever the input, and its session ending (re-read every
// Recheck).
func TestBoundsCloseATerminal(t *testing.T) {
	const idle, lifetime, recheck = 400 * time.Millisecond, 900 * time.Millisecond, 50 * time.Millisecond
	tests := []struct {
		name string
		// typing sends input every 100ms while the terminal is open.
		typing bool
		// end is the status its session takes once the terminal is up.
		end session.Status
		// within is how long the close may take from the connection.
		within time.Duration
		want   ending
	}{
		{name: "idle", within: idle + 300*time.Millisecond,
			want: ending{Code: websocket.StatusNormalClosure, Reason: "idle: no input for 400ms; reconnect for a new shell", ExitError: "idle: no input for 400ms; reconnect for a new shell"}},
		{name: "typed into, until its lifetime", typing: true, within: lifetime + 300*time.Millisecond,
			want: ending{Code: websocket.StatusNormalClosure, Reason: "lifetime: open for 900ms, the longest a terminal stays open; reconnect for a new shell",
				ExitError: "lifetime: open for 900ms, the longest a terminal stays open; reconnect for a new shell"}},
		{name: "its session closed", typing: true, end: session.StatusClosed, within: 300 * time.Millisecond,
			want: ending{Code: 4403, Reason: "forbidden: session s-ann has ended (closed)", ExitError: "forbidden: session s-ann has ended (closed)"}},
		{name: "its session reaped", typing: true, end: session.StatusFailed, within: 300 * time.Millisecond,
			want: ending{Code: 4403, Reason: "forbidden: session s-ann has ended (failed)", ExitError: "forbidden: session s-ann has ended (failed)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, termlimit.Limits{PerStudent: 3, PerProcess: 10, AuthTimeout: time.Second, Idle: idle, MaxLifetime: lifetime, Recheck: recheck})
			up := time.Now() // before the server's open: a lower bound of its time open
			s := r.dial("ann", r.token("ann"))
			s.connected()
			stop := make(chan struct{})
			defer close(stop)
			if tc.typing {
				go func() {
					for {
						select {
						case <-stop:
							return
						case <-s.done:
							return
						case <-time.After(100 * time.Millisecond):
							_ = s.c.Write(context.Background(), websocket.MessageBinary, []byte("x"))
						}
					}
				}()
			}
			if tc.end != "" {
				r.sessions.set("s-ann", tc.end)
			}
			got := s.closed(tc.within + time.Second)
			took := time.Since(up)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if took > tc.within {
				t.Errorf("closed after %s, want within %s", took, tc.within)
			}
			if tc.end == "" && took < idle {
				t.Errorf("closed after %s, before the idle timeout %s", took, idle)
			}
			// The terminal's place is given back.
			waitCounts(t, r.h, func(c termlimit.Counts) bool { return c.Open == 0 })
		})
	}
}
