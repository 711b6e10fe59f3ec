// Package terminal is the student's last way back into a lab when SSH
// fails: a web terminal that reaches the node through the Kubernetes API —
// pods/exec into a workspace Pod's container (kubelet → container runtime),
// or the serial console of a KubeVirt VMI — without sshd, and a one-click
// cleanup that asks the workspace Pod's guardian to kill every unprotected
// process (its POST /cleanup).
//
// guardian's POST /cleanup (method, bearer token, answers and errors) is
// described once, in guardian's own API description,
// guardian/httpapi/openapi.yaml; Guardian.Cleanup's tests check its
// request and its reading of every described answer against that file.
//
// The rule of both: a student reaches only their own running session.
// Ownership is Sessions.Get's (session.Service's: a session id of another
// student's is no session of theirs); anything that is not the caller's
// running session is refused with 403 forbidden before anything reaches
// the cluster.
//
// Endpoints (mounted under /terminal/ next to the session functions):
//
//	GET  /terminal/connect?session=ID[&node=NAME]   WebSocket
//	POST /terminal/cleanup  {"session":"ID"}        Authorization: Bearer JWT
//
// A browser cannot set an Authorization header on a WebSocket, and a
// cookie would make the WebSocket forgeable from another site (cross-site
// WebSocket hijacking). So the portal's token travels in the first
// WebSocket message, {"token":"<JWT>"}, never in the URL (which proxies
// log), and the upgrade is refused unless its Origin is the server's own
// (same host) — a page elsewhere can neither open the socket nor knows the
// token. A client that is not a browser may send the Authorization header
// with the upgrade instead; it is then checked before the upgrade and a
// refusal is an ordinary HTTP error. After the upgrade a refusal is a close
// with code 4000 + the HTTP status (4401, 4403, 4404, 4409, 4429) and the
// error code and message as reason.
//
// Every terminal holds a socket here and an exec stream through the API
// server, so each is bounded (Options.Limits, package termlimit): a
// student holds a few at once and the process a fixed number, sockets
// still waiting for their token included (past either cap: 429
// too_many_terminals, or a close with 4429); a socket that sends no token
// within the auth timeout is dropped; an open terminal is closed
// after no input for the idle timeout or at its maximum lifetime (1000,
// the reason starting "idle" or "lifetime"), and within seconds of its
// session ending (4403, the refusal a new terminal would get: it re-reads
// the session every few seconds through Sessions.Get). Each close of an
// open terminal is preceded by an exit message saying why.
//
// On the socket, binary messages are terminal bytes both ways (the client's
// are the terminal's input); text messages are JSON control messages: the
// client sends {"type":"resize","cols":C,"rows":R}, the server sends
// {"type":"connected",...} once the exec (or console) stream is up and
// {"type":"exit",...} when it ends. Each WebSocket runs one exec: a
// reconnect opens a new shell (the old one ended with its socket, as an SSH
// login does); the serial console of a VM is one device, so a reconnect
// finds it as the last connection left it.
//
// The terminal holds a connection open for as long as the student types, so
// it is served only where a process can hold one (the on-prem server), not
// from AWS Lambda or Google Cloud Functions (see infra/README.md).
package terminal

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/session"
	"labkeep/shared/termlimit"
	"labkeep/shared/workspacekey"
)

// DefaultCleanupTimeout bounds a call to guardian's /cleanup, which
// freezes, kills and thaws in rounds until nothing unprotected is left.
const DefaultCleanupTimeout = 30 * time.Second

// Options configure a Handler.
type Options struct {
	// Sessions decides whose session is whose (session.Service).
	Sessions Sessions
	// Auth verifies the portal's tokens, as the session functions do.
	Auth *access.Authenticator
	// API answers refusals through the session functions' one status
	// table (*httpapi.API), so the terminal's errors are theirs.
	API Refusals
	// Kube is the functions' own credentials (their ServiceAccount): it
	// needs pods/exec, get on Pods and, for VM labs,
	// virtualmachineinstances/console in the sessions namespace.
	Kube *rest.Config
	// Exec makes a pods/exec call into a workspace Pod's workspace
	// container (the Kubernetes adapter's WorkspaceExecutor).
	Exec Executor
	// Owners confirms each Pod or VMI is the session's own, in this
	// environment, before any call into it (the Kubernetes adapter's
	// Cluster); New refuses nil.
	Owners Owners
	// Namespace is the sessions namespace.
	Namespace string
	// Now is the clock (the Service's): it judges the sessions and the
	// terminals' idle and lifetime bounds.
	Now func() time.Time
	Log *slog.Logger
	// Limits bound the terminals (termlimit.DefaultLimits in production);
	// New refuses limits that do not validate.
	Limits termlimit.Limits
	// CleanupTimeout defaults to DefaultCleanupTimeout.
	CleanupTimeout time.Duration
	// WorkspaceKey derives each session's guardian cleanup token (the key
	// shared/kube put the tokens into the sessions' Secrets with).
	WorkspaceKey workspacekey.Key
}

// Executor makes a pods/exec call into the workspace container of Pod pod
// in namespace, with rc's credentials; opts names the command and its
// streams.
type Executor func(rc *rest.Config, client kubernetes.Interface, namespace, pod string, opts corev1.PodExecOptions) (remotecommand.Executor, error)

// Owners is what the terminal asks the cluster before a call into an
// object: the sessions namespace may be shared by two environments (each
// with its own database), and the functions' ServiceAccount may exec into
// any workspace Pod and open any VMI's console there, so a name alone
// (from this environment's session record) is not trusted with a
// student's keystrokes or a cleanup.
type Owners interface {
	// Owns returns nil if the Pod (kind pod) or VMI (kind vm) named name
	// carries this environment's labkeep.io/env and session's
	// labkeep.io/session labels; otherwise an error wrapping
	// access.ErrForbidden that says what it carries, or
	// session.ErrNotRunning if there is no such object.
	Owns(ctx context.Context, kind labs.Kind, name, session string) error
}

// Sessions is what the terminal asks of the session functions
// (session.Service): the student's session, as getSession answers it.
type Sessions interface {
	// Get is where student stands with id: their session, or their place
	// in the line if id is their waitlist entry's; session.ErrNoSession
	// if there is neither or it belongs to another student.
	Get(ctx context.Context, student, id string) (session.Standing, error)
}

// Refusals is how the terminal answers a refused request: the status,
// error code and JSON body the session functions give the same error. The
// terminal imports no other adapter; the entry point hands it the session
// functions' API, which implements this.
type Refusals interface {
	// WriteError answers r with err's status and error body.
	WriteError(w http.ResponseWriter, r *http.Request, err error)
	// StatusOf is err's status and error code, for a refusal after the
	// WebSocket upgrade (a close with 4000 + the status).
	StatusOf(err error) (status int, code string)
}

// Handler serves the terminal and cleanup endpoints.
type Handler struct {
	o        Options
	kube     kubernetes.Interface
	guardian *Guardian
	mux      *http.ServeMux
	// ledger counts this process's terminal sockets against o.Limits.
	ledger *termlimit.Ledger
}

// New returns the Handler.
func New(o Options) (*Handler, error) {
	if err := o.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("terminal limits: %w", err)
	}
	if o.Owners == nil {
		return nil, errors.New("terminal: Owners is required: no call goes into an object not confirmed the session's own")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.CleanupTimeout <= 0 {
		o.CleanupTimeout = DefaultCleanupTimeout
	}
	// The terminal's clients leave out Kube's WrapTransport (the local
	// stack's fault injection and request counting): it wraps one
	// transport, and each exec's upgrade builds a transport of its own.
	o.Kube = rest.CopyConfig(o.Kube)
	o.Kube.WrapTransport = nil
	kc, err := kubernetes.NewForConfig(o.Kube)
	if err != nil {
		return nil, err
	}
	h := &Handler{o: o, kube: kc, guardian: NewGuardian(kc, o.Namespace, o.WorkspaceKey, o.CleanupTimeout), ledger: termlimit.NewLedger(o.Limits)}
	h.mux = http.NewServeMux()
	h.mux.HandleFunc("GET /terminal/connect", h.connect)
	h.mux.HandleFunc("POST /terminal/cleanup", h.cleanup)
	h.mux.HandleFunc("/terminal/", func(w http.ResponseWriter, r *http.Request) {
		h.o.API.WriteError(w, r, fmt.Errorf("%w: no endpoint %s %s (GET /terminal/connect, POST /terminal/cleanup)", access.ErrNotFound, r.Method, r.URL.Path))
	})
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Mount serves /terminal/ with h and every other path with next.
func (h *Handler) Mount(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/terminal/") {
			h.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Target is the node of a student's own running session a terminal
// reaches.
type Target struct {
	Session session.Session
	Node    session.Node
	// Object is the node's Pod (pod labs) or VMI (VM labs).
	Object string
}

// Reach returns the node named node (the first one if empty) of the
// student's session id, if it is theirs and running at now. Every other
// case — no such session, another student's, ended, still provisioning,
// no such node — is a refusal that says which, wrapped in
// access.ErrForbidden, ErrBadRequest or session.ErrNotRunning.
func Reach(ctx context.Context, svc Sessions, now time.Time, student, id, node string) (Target, error) {
	if id == "" {
		return Target{}, fmt.Errorf("%w: the session id is required", access.ErrBadRequest)
	}
	got, err := svc.Get(ctx, student, id)
	if errors.Is(err, session.ErrNoSession) {
		return Target{}, fmt.Errorf("%w: session %s is not a session of yours", access.ErrForbidden, id)
	}
	if err != nil {
		return Target{}, err
	}
	if got.Waiting != nil {
		return Target{}, fmt.Errorf("%w: session %s is still waiting in line; its terminal opens once it is running", session.ErrNotRunning, id)
	}
	sess := *got.Session
	switch st := sess.StatusAt(now); {
	case !st.Live():
		return Target{}, fmt.Errorf("%w: session %s has ended (%s)", access.ErrForbidden, id, st)
	case st != session.StatusRunning:
		return Target{}, fmt.Errorf("%w: session %s is %s; its terminal opens once it is running", session.ErrNotRunning, id, st)
	}
	for _, n := range sess.Nodes {
		if node == "" || n.Name == node {
			return Target{Session: sess, Node: n, Object: session.NodeName(sess.ID, n.Name)}, nil
		}
	}
	return Target{}, fmt.Errorf("%w: session %s has no node %q", access.ErrBadRequest, id, node)
}

// Ended is the refusal that closes an open terminal of session id once a
// re-read of that session (Sessions.Get, as got and err) at now finds it
// no longer live or no longer the student's — closed, expired, reaped,
// failed — in the words Reach would refuse a new terminal with; nil while
// it is live. A live session keeps its terminal whatever its nodes do (a
// VM whose guest powered off boots again, and its serial console shows
// the boot). An error reading the session (the database unreachable)
// keeps it too, as a re-read that says nothing: the next one decides, and
// the terminal's own bounds hold meanwhile.
func Ended(id string, got session.Standing, err error, now time.Time) error {
	switch {
	case errors.Is(err, session.ErrNoSession):
		return fmt.Errorf("%w: session %s is no longer a session of yours", access.ErrForbidden, id)
	case err != nil:
		return nil
	case got.Waiting != nil || got.Session == nil:
		return fmt.Errorf("%w: session %s is no longer running", access.ErrForbidden, id)
	}
	if st := got.Session.StatusAt(now); !st.Live() {
		return fmt.Errorf("%w: session %s has ended (%s)", access.ErrForbidden, id, st)
	}
	return nil
}

// cleanupRequest is the body of POST /terminal/cleanup.
type cleanupRequest struct {
	Session string `json:"session"`
}

// CleanupReport is what POST /terminal/cleanup answers: guardian's report
// of the processes it killed in the workspace.
type CleanupReport struct {
	Session string `json:"session"`
	// Killed are the PIDs guardian killed (as guardian sees them, in the
	// Pod's PID namespace).
	Killed []int `json:"killed"`
	// Failed counts processes that could not be killed.
	Failed int `json:"failed"`
	// Note says why the cleanup may be incomplete.
	Note string `json:"note,omitempty"`
}

func (h *Handler) cleanup(w http.ResponseWriter, r *http.Request) {
	p, err := h.o.Auth.Authenticate(r)
	if err != nil {
		h.o.API.WriteError(w, r, err)
		return
	}
	var req cleanupRequest
	if err := decode(w, r, &req); err != nil {
		h.o.API.WriteError(w, r, err)
		return
	}
	t, err := Reach(r.Context(), h.o.Sessions, h.o.Now(), p.Subject, req.Session, "")
	if err == nil && t.Session.Kind != labs.KindPod {
		err = fmt.Errorf("%w: cleanup is for workspace Pod labs; session %s is a %s lab, with no guardian", access.ErrBadRequest, t.Session.ID, t.Session.Kind)
	}
	if err == nil {
		err = h.o.Owners.Owns(r.Context(), t.Session.Kind, t.Object, t.Session.ID)
	}
	if err != nil {
		h.o.API.WriteError(w, r, err)
		return
	}
	res, err := h.guardian.Cleanup(r.Context(), t.Session.ID, t.Object)
	if err != nil {
		h.o.Log.Warn("cleanup failed", "session", t.Session.ID, "err", err)
		h.o.API.WriteError(w, r, err)
		return
	}
	res.Session = t.Session.ID
	h.o.Log.Info("cleanup", "session", t.Session.ID, "student", p.Subject, "killed", len(res.Killed), "failed", res.Failed)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(res)
}

// maxBody bounds the cleanup request (one session id).
const maxBody = 4 << 10

// decode reads the cleanup request: application/json, one object, no
// unknown fields.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return fmt.Errorf("%w: Content-Type must be application/json, got %q", access.ErrUnsupportedMedia, ct)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: invalid JSON body: %v", access.ErrBadRequest, err)
	}
	return nil
}

// checkOrigin refuses a request whose Origin is not the server's own host:
// a browser always sends Origin with a WebSocket upgrade, so a page of
// another site cannot open the terminal in the student's name. A request
// without Origin is not from a browser page and carries its own
// credentials.
func checkOrigin(r *http.Request) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%w: Origin %q is not a URL with a host", access.ErrForbidden, origin)
	}
	if !strings.EqualFold(u.Host, r.Host) {
		return fmt.Errorf("%w: Origin %s is not this server's (%s)", access.ErrForbidden, u.Host, r.Host)
	}
	return nil
}

//go:embed page.html
var page []byte

// PageSecurityPolicy is the terminal page's Content-Security-Policy: the
// portal's (shared/portal) but for inline styles, because xterm.js
// writes its measurements and colours into <style> elements it creates.
// Scripts stay this origin's files only, so an injected style can restyle
// the page but run nothing, and the page renders no markup it did not
// write (terminal output is drawn by xterm.js, never parsed as HTML).
const PageSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Page serves the terminal page (mounted by the portal at
// /portal/terminal?session=ID, behind its security headers): its script
// (terminal-page.js) reads the session from the query and the token from
// the tab's sessionStorage, where the portal keeps it. It replaces the
// portal's policy with PageSecurityPolicy.
func Page() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", PageSecurityPolicy)
		_, _ = w.Write(page)
	})
}
