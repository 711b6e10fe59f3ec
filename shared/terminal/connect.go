package terminal

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/termlimit"
)

// HangupGrace bounds the hang-up of a shell whose socket has gone (its
// input closed, then SIGHUP through a second exec: see Hangup), and then
// how long it has to end by itself before its stream is cut.
const HangupGrace = 5 * time.Second

// MaxMessageBytes bounds a message from the client (a paste, a resize).
const MaxMessageBytes = 64 << 10

// closeCode is the WebSocket close code of a refusal with HTTP status
// status: 4000 + status (4401, 4403, ...), in the range applications own.
func closeCode(status int) websocket.StatusCode { return websocket.StatusCode(4000 + status) }

// control is a text message, either way.
type control struct {
	Type string `json:"type"`
	// Token is the first message's portal token.
	Token string `json:"token,omitempty"`
	// Cols and Rows are a resize's terminal size.
	Cols uint16 `json:"cols,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	// Session, Node, Kind and Object describe what a connected terminal
	// reaches.
	Session string `json:"session,omitempty"`
	Node    string `json:"node,omitempty"`
	Kind    string `json:"kind,omitempty"`
	Object  string `json:"object,omitempty"`
	// Error is why the stream ended, if it ended on an error (exit).
	Error string `json:"error,omitempty"`
	// ExitCode is the shell's exit status, when it exited.
	ExitCode *int `json:"exitCode,omitempty"`
}

func (h *Handler) connect(w http.ResponseWriter, r *http.Request) {
	if err := checkOrigin(r); err != nil {
		h.o.API.WriteError(w, r, err)
		return
	}
	q := r.URL.Query()
	id, node := q.Get("session"), q.Get("node")
	// A client that can set headers authenticates before the upgrade.
	preAuthorized := r.Header.Get("Authorization") != ""
	// Every socket counts against the process's cap from here, before
	// anything is known of its caller: sockets that never send a token
	// hold a place until the auth timeout, and no more of them than the
	// cap can be held at once.
	place, err := h.ledger.Arrive()
	if err != nil {
		h.o.Log.Info("terminal refused", "session", id, "err", err)
		if preAuthorized {
			h.o.API.WriteError(w, r, err)
			return
		}
		// A browser learns why only from a close: upgrade, then refuse.
		if c, aerr := websocket.Accept(w, r, nil); aerr == nil {
			h.refuse(c, id, err)
		}
		return
	}
	defer place.Leave()
	var target Target
	var student string
	if preAuthorized {
		t, p, err := h.authorize(r.Context(), r, id, node)
		if err == nil {
			err = place.Admit(p)
		}
		if err != nil {
			h.o.API.WriteError(w, r, err)
			return
		}
		target, student = t, p
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		h.o.Log.Info("terminal upgrade refused", "err", err)
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(MaxMessageBytes)
	ctx := r.Context()
	if !preAuthorized {
		t, p, err := h.firstMessage(ctx, c, r, id, node)
		if err == nil {
			err = place.Admit(p)
		}
		if err != nil {
			h.refuse(c, id, err)
			return
		}
		target, student = t, p
	}
	h.run(ctx, c, target, student)
}

// refuse closes c with err's refusal: 4000 + its status, and its code and
// message as reason (an internal error's message withheld and logged).
func (h *Handler) refuse(c *websocket.Conn, id string, err error) {
	code, reason := h.closing(id, err)
	_ = c.Close(code, reason)
}

// closing is the close code and reason of refusal err: 4000 + its status,
// and its code and message.
func (h *Handler) closing(id string, err error) (websocket.StatusCode, string) {
	status, code := h.o.API.StatusOf(err)
	msg := err.Error()
	if status == http.StatusInternalServerError {
		h.o.Log.Error("terminal refused", "session", id, "err", err)
		msg = "internal error"
	}
	if !strings.HasPrefix(msg, code+": ") {
		msg = code + ": " + msg
	}
	return closeCode(status), truncate(msg, maxReason)
}

// maxReason bounds a close reason: a close frame's payload is at most 125
// bytes, two of them the code.
const maxReason = 123

// firstMessage reads the token from the socket's first message and
// authorizes it for session id.
func (h *Handler) firstMessage(ctx context.Context, c *websocket.Conn, r *http.Request, id, node string) (Target, string, error) {
	rctx, cancel := context.WithTimeout(ctx, h.o.Limits.AuthTimeout)
	defer cancel()
	typ, b, err := c.Read(rctx)
	if err != nil {
		return Target{}, "", fmt.Errorf("%w: no token within %s: %v", access.ErrUnauthorized, h.o.Limits.AuthTimeout, err)
	}
	var m control
	if typ != websocket.MessageText || json.Unmarshal(b, &m) != nil || m.Token == "" {
		return Target{}, "", fmt.Errorf("%w: the first message must be {\"token\":\"<JWT>\"}", access.ErrUnauthorized)
	}
	req := r.Clone(ctx)
	req.Header.Set("Authorization", "Bearer "+m.Token)
	return h.authorize(ctx, req, id, node)
}

// authorize authenticates r and reaches the caller's node, confirmed the
// session's own in this environment (Owners); it returns the caller (the
// student the terminal counts against) too.
func (h *Handler) authorize(ctx context.Context, r *http.Request, id, node string) (Target, string, error) {
	p, err := h.o.Auth.Authenticate(r)
	if err != nil {
		return Target{}, "", err
	}
	t, err := Reach(ctx, h.o.Sessions, h.o.Now(), p.Subject, id, node)
	if err == nil {
		err = h.o.Owners.Owns(ctx, t.Session.Kind, t.Object, t.Session.ID)
	}
	return t, p.Subject, err
}

// run bridges the socket to the target's exec or console until either
// ends, or until a bound closes it (watch).
func (h *Handler) run(ctx context.Context, c *websocket.Conn, t Target, student string) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	log := h.o.Log.With("session", t.Session.ID, "object", t.Object)
	stdinR, stdinW := io.Pipe()
	sizes := newSizeQueue()
	connected := func() {
		_ = c.Write(ctx, websocket.MessageText, mustJSON(control{Type: "connected", Session: t.Session.ID, Node: t.Node.Name, Kind: string(t.Session.Kind), Object: t.Object}))
	}
	// A shell's stream is up when its first output (the prompt) arrives; a
	// serial console's when virt-handler has accepted it, since an idle
	// getty writes nothing until the student types.
	out := &socketWriter{ctx: ctx, c: c, first: connected}
	// finish ends the terminal from this side, once: an exit message
	// saying why, then the close. Whoever comes second (the stream's end
	// after a bound closed the socket) waits for the first and does
	// nothing.
	var once sync.Once
	finish := func(end control, code websocket.StatusCode, reason string) {
		once.Do(func() {
			out.control(end)
			_ = c.Close(code, reason)
		})
	}
	// When the socket goes, the shell is hung up as when an SSH
	// connection drops: its input is closed and it gets SIGHUP (Hangup),
	// and its stream has HangupGrace to end by itself before it is cut.
	gone, ended := make(chan struct{}), make(chan struct{})
	id := rand.Text()
	go func() {
		select {
		case <-gone:
			select {
			case <-ended:
				return // the stream ended first
			default:
			}
			if t.Session.Kind == labs.KindPod {
				// Not cut when the stream ends: the hang-up ends it.
				hctx, done := context.WithTimeout(context.WithoutCancel(ctx), HangupGrace)
				if err := h.execPod(hctx, t.Object, Hangup(id), nil, io.Discard, nil); err != nil {
					log.Warn("terminal hang-up failed", "err", err)
				}
				done()
			}
			select {
			case <-time.After(HangupGrace):
				cancel()
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()
	opened := h.o.Now()
	// input is when the client last sent terminal input (UnixNano, by
	// h.o.Now), for the idle bound.
	var input atomic.Int64
	input.Store(opened.UnixNano())
	go func() {
		defer close(gone)
		defer stdinW.Close()
		defer sizes.close()
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				input.Store(h.o.Now().UnixNano())
				if _, err := stdinW.Write(b); err != nil {
					return
				}
				continue
			}
			var m control
			if json.Unmarshal(b, &m) == nil && m.Type == "resize" && m.Cols > 0 && m.Rows > 0 {
				sizes.push(remotecommand.TerminalSize{Width: m.Cols, Height: m.Rows})
			}
		}
	}()
	go h.watch(ctx, t, student, opened, &input, ended, log, finish)
	log.Info("terminal opened", "kind", t.Session.Kind, "student", student)
	var err error
	switch t.Session.Kind {
	case labs.KindPod:
		err = h.execPod(ctx, t.Object, Shell(id), stdinR, out, sizes)
	default:
		err = h.serialConsole(ctx, t.Object, stdinR, out, out.up)
	}
	close(ended)
	end := control{Type: "exit"}
	var exit interface{ ExitStatus() int }
	switch {
	case errors.As(err, &exit):
		code := exit.ExitStatus()
		end.ExitCode = &code
	case err != nil && ctx.Err() == nil:
		end.Error = err.Error()
	case err == nil:
		zero := 0
		end.ExitCode = &zero
	}
	log.Info("terminal closed", "err", err)
	select {
	case <-gone:
		return
	default:
	}
	// The stream ended by itself (the shell exited, or its container went
	// with a session being closed): if the session has ended, that is what
	// the student is told.
	if refusal := h.recheck(ctx, t, student, log); refusal != nil {
		code, reason := h.closing(t.Session.ID, refusal)
		end.Error = refusal.Error()
		finish(end, code, reason)
		return
	}
	finish(end, websocket.StatusNormalClosure, "")
}

// watch closes the terminal, through finish, when one of its bounds says
// so (termlimit.Limits.Decide): its session no longer live (re-read every
// Recheck and before any other close), no input for Idle, or open for
// MaxLifetime. Closing the socket hangs the shell up as a student's
// leaving does. It returns when the stream has ended or ctx is done.
func (h *Handler) watch(ctx context.Context, t Target, student string, opened time.Time, input *atomic.Int64,
	ended <-chan struct{}, log *slog.Logger, finish func(control, websocket.StatusCode, string)) {
	l := h.o.Limits
	times := termlimit.Times{Opened: opened, Input: opened, Checked: opened}
	timer := time.NewTimer(l.Decide(times, opened).Wake.Sub(opened))
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-ended:
			return
		case <-ctx.Done():
			return
		}
		now := h.o.Now()
		times.Input = time.Unix(0, input.Load())
		v := l.Decide(times, now)
		if v.Recheck {
			if refusal := h.recheck(ctx, t, student, log); refusal != nil {
				log.Info("terminal closed: its session ended", "student", student, "why", refusal)
				code, reason := h.closing(t.Session.ID, refusal)
				finish(control{Type: "exit", Error: refusal.Error()}, code, reason)
				return
			}
			times.Checked = now
		}
		if v.Timeout != termlimit.NoTimeout {
			reason := l.Reason(v.Timeout)
			log.Info("terminal closed on time", "student", student, "why", reason)
			finish(control{Type: "exit", Error: reason}, websocket.StatusNormalClosure, truncate(reason, maxReason))
			return
		}
		timer.Reset(v.Wake.Sub(now))
	}
}

// recheck re-reads the terminal's session and returns the refusal that
// closes it (Ended), or nil while it stays open.
func (h *Handler) recheck(ctx context.Context, t Target, student string, log *slog.Logger) error {
	rctx, cancel := context.WithTimeout(ctx, h.o.Limits.Recheck)
	defer cancel()
	got, err := h.o.Sessions.Get(rctx, student, t.Session.ID)
	refusal := Ended(t.Session.ID, got, err, h.o.Now())
	if refusal == nil && err != nil && ctx.Err() == nil {
		log.Warn("terminal cannot re-read its session; it stays open", "err", err)
	}
	return refusal
}

// socketWriter writes terminal output as binary messages, after calling
// first (under its lock) before the first one.
type socketWriter struct {
	ctx   context.Context
	mu    sync.Mutex
	c     *websocket.Conn
	first func()
}

func (s *socketWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.announce()
	// Output the socket can no longer take is dropped, not an error: the
	// stream keeps running until the shell has seen its hang-up.
	_ = s.c.Write(s.ctx, websocket.MessageBinary, p)
	return len(p), nil
}

// up says the stream is up before any output (first, once).
func (s *socketWriter) up() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.announce()
}

// announce runs first once; s.mu is held.
func (s *socketWriter) announce() {
	if s.first != nil {
		s.first()
		s.first = nil
	}
}

func (s *socketWriter) control(m control) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.c.Write(s.ctx, websocket.MessageText, mustJSON(m))
}

// mustJSON encodes a control message (which always encodes).
func mustJSON(m control) []byte {
	b, _ := json.Marshal(m)
	return b
}

// sizeQueue hands the client's resizes to the exec stream; only the latest
// size waiting matters.
type sizeQueue struct {
	ch   chan remotecommand.TerminalSize
	done chan struct{}
	once sync.Once
}

func newSizeQueue() *sizeQueue {
	return &sizeQueue{ch: make(chan remotecommand.TerminalSize, 1), done: make(chan struct{})}
}

func (q *sizeQueue) push(s remotecommand.TerminalSize) {
	select {
	case <-q.ch: // drop the stale size
	default:
	}
	select {
	case q.ch <- s:
	case <-q.done:
	}
}

func (q *sizeQueue) close() { q.once.Do(func() { close(q.done) }) }

// Next implements remotecommand.TerminalSizeQueue; nil ends the resizes.
func (q *sizeQueue) Next() *remotecommand.TerminalSize {
	select {
	case s := <-q.ch:
		return &s
	case <-q.done:
		return nil
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
