package terminal

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/shared/access"
	"labkeep/shared/labs"
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
	var target Target
	if preAuthorized {
		t, err := h.authorize(r.Context(), r, id, node)
		if err != nil {
			h.o.API.WriteError(w, r, err)
			return
		}
		target = t
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
		t, err := h.firstMessage(ctx, c, r, id, node)
		if err != nil {
			status, code := h.o.API.StatusOf(err)
			msg := err.Error()
			if status == http.StatusInternalServerError {
				h.o.Log.Error("terminal refused", "session", id, "err", err)
				msg = "internal error"
			}
			_ = c.Close(closeCode(status), truncate(code+": "+msg, 120))
			return
		}
		target = t
	}
	h.run(ctx, c, target)
}

// firstMessage reads the token from the socket's first message and
// authorizes it for session id.
func (h *Handler) firstMessage(ctx context.Context, c *websocket.Conn, r *http.Request, id, node string) (Target, error) {
	rctx, cancel := context.WithTimeout(ctx, h.o.AuthTimeout)
	defer cancel()
	typ, b, err := c.Read(rctx)
	if err != nil {
		return Target{}, fmt.Errorf("%w: no token within %s: %v", access.ErrUnauthorized, h.o.AuthTimeout, err)
	}
	var m control
	if typ != websocket.MessageText || json.Unmarshal(b, &m) != nil || m.Token == "" {
		return Target{}, fmt.Errorf("%w: the first message must be {\"token\":\"<JWT>\"}", access.ErrUnauthorized)
	}
	req := r.Clone(ctx)
	req.Header.Set("Authorization", "Bearer "+m.Token)
	return h.authorize(ctx, req, id, node)
}

// authorize authenticates r and reaches the caller's node.
func (h *Handler) authorize(ctx context.Context, r *http.Request, id, node string) (Target, error) {
	p, err := h.o.Auth.Authenticate(r)
	if err != nil {
		return Target{}, err
	}
	return Reach(ctx, h.o.Sessions, h.o.Now(), p.Subject, id, node)
}

// run bridges the socket to the target's exec or console until either
// ends.
func (h *Handler) run(ctx context.Context, c *websocket.Conn, t Target) {
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
	log.Info("terminal opened", "kind", t.Session.Kind)
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
	default:
		out.control(end)
		_ = c.Close(websocket.StatusNormalClosure, "")
	}
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
