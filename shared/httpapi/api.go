// Package httpapi serves the session functions over HTTP/JSON for the
// student portal: authentication (HS256 JWT), request validation, the
// session JSON and the single table mapping errors to status codes. The
// same http.Handler runs on Knative, behind the AWS Lambda shim and under
// Google Cloud Functions, so every platform behaves identically.
//
// Every request is fully validated (auth, method, content type, size,
// unknown fields) before anything changes, so a bad request changes
// nothing.
package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"labkeep/shared/line"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"time"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/session"
)

// MaxBodyBytes is the largest request body accepted (413 beyond).
const MaxBodyBytes = 64 << 10

// Sessions is what the API asks of the session functions
// (session.Service): the student's calls, the catalog /labs lists and
// every live session for adminSessions. An open and a poll answer where
// the student stands (a session, or a place in the line); the API renders
// either as the one session JSON.
type Sessions interface {
	// Open and OpenWaiting open lab for student, a member of courses
	// (whose reserved seats are theirs).
	Open(ctx context.Context, student, lab, publicKey string, courses ...string) (session.Standing, error)
	OpenWaiting(ctx context.Context, student, lab, publicKey string, courses ...string) (session.Standing, error)
	Get(ctx context.Context, student, id string) (session.Standing, error)
	Extend(ctx context.Context, student, id string) (session.Session, error)
	Close(ctx context.Context, student, id string, actor session.Actor, by string) (session.Session, error)
	// ListLive is every live session, unclaimed warm-pool instances
	// included, oldest first.
	ListLive(ctx context.Context) ([]session.Session, error)
	// Catalog is the lab catalog opens are checked against.
	Catalog() session.Catalog
}

// Options configures an API.
type Options struct {
	Sessions Sessions
	// Seats is the line and the warm pool as adminStatus reports them;
	// nil reports every lab's line empty and no warm pool.
	Seats Seats
	Auth  *access.Authenticator
	// Now is the clock for serverTime and remainingSeconds; it must be the
	// clock the Service uses.
	Now func() time.Time
	Log *slog.Logger
	// RetryAfter is the Retry-After sent with 503 no_capacity and 429
	// too_many_terminals.
	RetryAfter time.Duration
	// Reservations serves POST /adminReserve, GET /adminReservations,
	// POST /adminCancelReservation and GET /reservations; nil: no such
	// routes.
	Reservations ReservationDesk
}

// DefaultRetryAfter is the Retry-After of a 503 no_capacity unless told
// otherwise.
const DefaultRetryAfter = 30 * time.Second

// API is the HTTP handler of the session functions.
type API struct {
	svc        Sessions
	seats      Seats
	auth       *access.Authenticator
	now        func() time.Time
	log        *slog.Logger
	retryAfter time.Duration
	mux        *http.ServeMux
}

// routes lists each session path with its only method (for 405 Allow).
var routes = map[string]string{
	"/openSession":   http.MethodPost,
	"/extendSession": http.MethodPost,
	"/getSession":    http.MethodGet,
	"/closeSession":  http.MethodPost,
	"/labs":          http.MethodGet,
	"/healthz":       http.MethodGet,
	"/openapi.yaml":  http.MethodGet,

	"/adminReserve":           http.MethodPost,
	"/adminReservations":      http.MethodGet,
	"/adminCancelReservation": http.MethodPost,
	"/reservations":           http.MethodGet,
}

// refuseMethod answers 405 method_not_allowed, with the route's method in
// Allow, when r uses another method on a path of table (GET routes accept
// HEAD too); it reports whether it answered.
func (a *API) refuseMethod(table map[string]string, w http.ResponseWriter, r *http.Request) bool {
	m, ok := table[r.URL.Path]
	if !ok || r.Method == m || (m == http.MethodGet && r.Method == http.MethodHead) {
		return false
	}
	w.Header().Set("Allow", m)
	a.writeError(w, r, fmt.Errorf("%w: %s %s; use %s", access.ErrMethodNotAllowed, r.Method, r.URL.Path, m), nil)
	return true
}

// New returns the API. Register more routes (e.g. the reaper's) on a mux
// in front of it; everything else falls through to a JSON 404.
func New(o Options) *API {
	a := &API{svc: o.Sessions, seats: o.Seats, auth: o.Auth, now: o.Now, log: o.Log, retryAfter: o.RetryAfter}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.retryAfter <= 0 {
		a.retryAfter = DefaultRetryAfter
	}
	a.mux = http.NewServeMux()
	a.mux.HandleFunc("/openSession", a.open)
	a.mux.HandleFunc("/extendSession", a.extend)
	a.mux.HandleFunc("/getSession", a.get)
	a.mux.HandleFunc("/closeSession", a.close)
	a.mux.HandleFunc("/labs", a.labs)
	a.mux.HandleFunc("/openapi.yaml", a.openapi)
	if o.Reservations != nil {
		a.serveReservations(a.mux, o.Reservations)
	}
	a.mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		a.writeError(w, r, fmt.Errorf("%w: no endpoint %s", access.ErrNotFound, r.URL.Path), nil)
	})
	return a
}

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if a.refuseMethod(routes, w, r) {
		return
	}
	a.mux.ServeHTTP(w, r)
}

// Authenticate exposes the API's authentication for other handlers on the
// same server (e.g. the reaper's admin endpoints) and writes the 401 itself
// when it fails; ok is false then.
func (a *API) Authenticate(w http.ResponseWriter, r *http.Request) (p access.Principal, ok bool) {
	p, err := a.auth.Authenticate(r)
	if err != nil {
		a.writeError(w, r, err, nil)
		return p, false
	}
	return p, true
}

// WriteError writes err through the status table (for handlers added
// next to the API).
func (a *API) WriteError(w http.ResponseWriter, r *http.Request, err error) {
	a.writeError(w, r, err, nil)
}

type openRequest struct {
	Lab string `json:"lab"`
	// PublicKey is the student's own SSH public key (one authorized_keys
	// line). Without it labkeep generates a key pair and returns the
	// private key in this one response.
	PublicKey string `json:"publicKey,omitempty"`
	// Student lets an admin act for a student; students may not set it.
	Student string `json:"student,omitempty"`
	// Wait joins the waitlist instead of answering 503 no_capacity: the
	// answer is then 202 with a queued session (session.OpenWaiting: a
	// place in the line).
	Wait bool `json:"wait,omitempty"`
}

type sessionRequest struct {
	// ID optionally names the session; it must be the caller's live one.
	ID      string `json:"id,omitempty"`
	Student string `json:"student,omitempty"`
}

func (a *API) open(w http.ResponseWriter, r *http.Request) {
	p, ok := a.Authenticate(w, r)
	if !ok {
		return
	}
	var req openRequest
	if err := decodeBody(w, r, &req, true); err != nil {
		a.writeErrorFor(w, r, p, err, nil)
		return
	}
	student, err := actingFor(p, req.Student)
	if err != nil {
		a.writeErrorFor(w, r, p, err, nil)
		return
	}
	if req.Lab == "" {
		a.writeErrorFor(w, r, p, fmt.Errorf("%w: \"lab\" is required", access.ErrBadRequest), nil)
		return
	}
	open, status := a.svc.Open, http.StatusCreated
	if req.Wait {
		open = a.svc.OpenWaiting
	}
	// The caller's seats are theirs alone: an admin opening for a
	// student opens in the general line.
	var courses []string
	if student == p.Subject {
		courses = p.SeatsIn()
	}
	st, err := open(r.Context(), student, req.Lab, req.PublicKey, courses...)
	if st.Waiting != nil {
		status = http.StatusAccepted
	}
	a.replyStanding(w, r, p, status, st, err)
}

// replyStanding writes where the student stands with status: a place in
// the line as a queued session (waitingView), a session as reply does;
// or err, as reply does, with the session it concerns if there is one.
func (a *API) replyStanding(w http.ResponseWriter, r *http.Request, p access.Principal, status int, st session.Standing, err error) {
	if err == nil && st.Waiting != nil {
		writeJSON(w, status, a.waitingView(*st.Waiting))
		return
	}
	var sess session.Session
	if st.Session != nil {
		sess = *st.Session
	}
	a.reply(w, r, p, status, sess, err)
}

// reply writes sess with status for caller p, or err through the status
// table together with the session it concerns (none when sess has no id).
func (a *API) reply(w http.ResponseWriter, r *http.Request, p access.Principal, status int, sess session.Session, err error) {
	if err != nil {
		a.writeErrorFor(w, r, p, err, &sess)
		return
	}
	writeJSON(w, status, a.view(sess, p))
}

func (a *API) extend(w http.ResponseWriter, r *http.Request) {
	p, student, req, ok := a.sessionRequest(w, r)
	if !ok {
		return
	}
	sess, err := a.svc.Extend(r.Context(), student, req.ID)
	if errors.Is(err, session.ErrNoSession) {
		sess = session.Session{}
	}
	a.reply(w, r, p, http.StatusOK, sess, err)
}

func (a *API) close(w http.ResponseWriter, r *http.Request) {
	p, student, req, ok := a.sessionRequest(w, r)
	if !ok {
		return
	}
	sess, err := a.svc.Close(r.Context(), student, req.ID, p.Actor(), p.Subject)
	if err != nil {
		sess = session.Session{} // a failed close answers with the error alone
	}
	a.reply(w, r, p, http.StatusOK, sess, err)
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	p, ok := a.Authenticate(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	for k := range q {
		if k != "id" && k != "student" {
			a.writeErrorFor(w, r, p, fmt.Errorf("%w: unknown query parameter %q (allowed: id, student)", access.ErrBadRequest, k), nil)
			return
		}
	}
	student, err := actingFor(p, q.Get("student"))
	if err != nil {
		a.writeErrorFor(w, r, p, err, nil)
		return
	}
	st, err := a.svc.Get(r.Context(), student, q.Get("id"))
	if err != nil {
		st = session.Standing{}
	}
	a.replyStanding(w, r, p, http.StatusOK, st, err)
}

// labJSON is one lab a student may open, as GET /labs lists it.
type labJSON struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Kind        string `json:"kind"`
	// Nodes is how many machines the lab has.
	Nodes int `json:"nodes"`
}

// labs lists the labs of the catalog, by name, for any signed-in caller
// (the portal's lab chooser).
func (a *API) labs(w http.ResponseWriter, r *http.Request) {
	if _, ok := a.Authenticate(w, r); !ok {
		return
	}
	if len(r.URL.Query()) > 0 {
		a.writeError(w, r, fmt.Errorf("%w: /labs takes no query parameters", access.ErrBadRequest), nil)
		return
	}
	out := struct {
		Labs []labJSON `json:"labs"`
	}{Labs: []labJSON{}}
	cat := a.svc.Catalog()
	for _, name := range cat.Names() {
		lab, _ := cat.Get(name)
		out.Labs = append(out.Labs, labJSON{Name: lab.Name, Description: lab.Description, Kind: string(lab.Kind), Nodes: len(lab.Nodes)})
	}
	writeJSON(w, http.StatusOK, out)
}

// sessionRequest authenticates and parses the optional body of extend and
// close, returning the student acted for.
func (a *API) sessionRequest(w http.ResponseWriter, r *http.Request) (access.Principal, string, sessionRequest, bool) {
	var req sessionRequest
	p, ok := a.Authenticate(w, r)
	if !ok {
		return p, "", req, false
	}
	if err := decodeBody(w, r, &req, false); err != nil {
		a.writeErrorFor(w, r, p, err, nil)
		return p, "", req, false
	}
	student, err := actingFor(p, req.Student)
	if err != nil {
		a.writeErrorFor(w, r, p, err, nil)
		return p, "", req, false
	}
	return p, student, req, true
}

// actingFor returns whose session the caller acts on: a student always
// their own; an admin the named student, or their own subject if none.
func actingFor(p access.Principal, student string) (string, error) {
	if student == "" || student == p.Subject {
		return p.Subject, nil
	}
	if !p.Admin() {
		return "", fmt.Errorf("%w: students can only act on their own session", access.ErrForbidden)
	}
	return student, nil
}

// decodeBody reads a JSON object into v: at most MaxBodyBytes, content
// type application/json, no unknown fields, nothing after the object. An
// empty body is accepted only if !required.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, required bool) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return fmt.Errorf("%w: request body exceeds %d bytes", access.ErrTooLarge, MaxBodyBytes)
	}
	if err != nil {
		return fmt.Errorf("%w: reading body: %v", access.ErrBadRequest, err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if required {
			return fmt.Errorf("%w: a JSON body is required", access.ErrBadRequest)
		}
		return nil
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return fmt.Errorf("%w: Content-Type must be application/json, got %q", access.ErrUnsupportedMedia, r.Header.Get("Content-Type"))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: invalid JSON body: %v", access.ErrBadRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: invalid JSON body: data after the object", access.ErrBadRequest)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: invalid JSON body: data after the object", access.ErrBadRequest)
	}
	return nil
}

type sshJSON struct {
	Host string `json:"host"`
	Port int32  `json:"port"`
	// User is who the student logs in as.
	User string `json:"user"`
	// KnownHosts is the known_hosts line that verifies this node's host
	// key at host:port; empty until the host is known.
	KnownHosts string `json:"knownHosts,omitempty"`
}

type nodeJSON struct {
	Name  string `json:"name"`
	Role  string `json:"role"`
	Ready bool   `json:"ready"`
	// Phase is how far the node is: scheduled (created, no address yet),
	// unschedulable (the cluster cannot place it now: PhaseReason says
	// why), booting (it has an address, SSH not ready) or ready.
	Phase string `json:"phase"`
	// PhaseReason is why an unschedulable node waits, in the scheduler's
	// (or KubeVirt's) words.
	PhaseReason string  `json:"phaseReason,omitempty"`
	SSH         sshJSON `json:"ssh"`
}

// The phases of a node, in order; unschedulable is scheduled held back.
const (
	PhaseScheduled     = "scheduled"
	PhaseUnschedulable = "unschedulable"
	PhaseBooting       = "booting"
	PhaseReady         = "ready"
)

func nodePhase(n session.Node) string {
	switch {
	case n.Ready:
		return PhaseReady
	case n.SSHHost != "":
		return PhaseBooting
	case n.Unschedulable != "":
		return PhaseUnschedulable
	}
	return PhaseScheduled
}

// warningJSON is one warning before expiry (lifetime.Warnings).
type warningJSON struct {
	// BeforeSeconds is how long before expiry it comes.
	BeforeSeconds int64     `json:"beforeSeconds"`
	At            time.Time `json:"at"`
	// Due is true from At until the session expires.
	Due bool `json:"due"`
}

type sessionJSON struct {
	ID               string     `json:"id"`
	Student          string     `json:"student"`
	Lab              string     `json:"lab"`
	Kind             string     `json:"kind"`
	Status           string     `json:"status"`
	StartedAt        time.Time  `json:"startedAt"`
	ExpiresAt        time.Time  `json:"expiresAt"`
	MaxExpiresAt     time.Time  `json:"maxExpiresAt"`
	ReadyAt          *time.Time `json:"readyAt,omitempty"`
	FinishedAt       *time.Time `json:"finishedAt,omitempty"`
	RemainingSeconds int64      `json:"remainingSeconds"`
	Extendable       bool       `json:"extendable"`
	ServerTime       time.Time  `json:"serverTime"`
	Nodes            []nodeJSON `json:"nodes"`
	FailureReason    string     `json:"failureReason"`
	// HostKey is the session's SSH host public key, which every node presents.
	HostKey string `json:"hostKey,omitempty"`
	// StudentKey is the public key that logs the student in.
	StudentKey string `json:"studentKey,omitempty"`
	// PrivateKey is the generated private key, in the openSession response
	// only, and only when the student sent no public key: labkeep keeps no
	// copy and can never show it again.
	PrivateKey string `json:"privateKey,omitempty"`
	// ExtendRefusal says why a live session cannot be extended now (at
	// its maximum lifetime, expired, still provisioning).
	ExtendRefusal string `json:"extendRefusal,omitempty"`
	// Warnings are when a live session's student is warned of its end
	// (10 and 5 minutes before expiry), each due or not at serverTime.
	Warnings []warningJSON `json:"warnings,omitempty"`
	// Home is the student's home the session holds: what stays when the
	// session ends (GET /homes, /homeArchive).
	Home *homeJSON `json:"home,omitempty"`
	// QueuePosition (1: next), ETASeconds (likely wait) and
	// ETALatestSeconds (the longest wait) are a queued session's place in
	// the waitlist (line.Place, seating.QueueETAs); a session has none.
	QueuePosition    *int   `json:"queuePosition,omitempty"`
	ETASeconds       *int64 `json:"etaSeconds,omitempty"`
	ETALatestSeconds *int64 `json:"etaLatestSeconds,omitempty"`
}

// homeJSON is the home a session holds: its name, and where the session
// mounts it (the lab's mount path in the catalog in force; empty once the
// lab is gone from it).
type homeJSON struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// NotReadyToExtend is extendRefusal while a session is provisioning.
const NotReadyToExtend = "the lab can be extended once it is ready"

// StatusQueued is the status a place in the line (line.Waiting) reads
// as. It is no session.Status: a place has no session row; clients see
// one JSON shape, the session's, whether the student has a session or
// waits for one.
const StatusQueued = "queued"

// view renders a session at the server's now for caller p.
// remainingSeconds is the lifetime package's Remaining — the reaper's own
// expiry test — so the countdown and the reaper agree to the second, and
// status is Session.StatusAt: a live session whose time is up reads
// expired (remainingSeconds 0, not extendable) even before the reaper has
// deleted it. failureReason is the end reason's one student sentence for
// students (never the stored detail, which may quote the cluster) and the
// full reason for admins.
func (a *API) view(s session.Session, p access.Principal) sessionJSON {
	now := a.now().UTC()
	v := sessionJSON{
		ID: s.ID, Student: s.Student, Lab: s.Lab, Kind: string(s.Kind), Status: string(s.StatusAt(now)),
		StartedAt: s.StartedAt, ExpiresAt: s.ExpiresAt, MaxExpiresAt: s.MaxExpiresAt,
		ServerTime: now, FailureReason: s.End.Sentence(), Nodes: []nodeJSON{},
		HostKey: s.HostKey, StudentKey: s.StudentKey, PrivateKey: s.Issued.StudentPrivateKey,
	}
	if p.Admin() {
		v.FailureReason = s.End.String()
	}
	if s.Status.Live() {
		// Rounded up, so remainingSeconds is 0 exactly when the reaper's
		// test says expired, never while the session can still be extended.
		left := lifetime.Remaining(s.Window, now)
		v.RemainingSeconds = int64((left + time.Second - 1) / time.Second)
		v.Extendable = s.Status == session.StatusRunning && lifetime.Extendable(s.Window, now)
		if err := lifetime.ExtendRefusal(s.Window, now); err != nil {
			v.ExtendRefusal = err.Error()
		} else if s.Status != session.StatusRunning {
			v.ExtendRefusal = NotReadyToExtend
		}
		for _, wn := range lifetime.Warnings(s.Window) {
			v.Warnings = append(v.Warnings, warningJSON{BeforeSeconds: int64(wn.Before / time.Second), At: wn.At, Due: wn.Due(s.Window, now)})
		}
	}
	if s.Home != "" {
		v.Home = &homeJSON{Name: s.Home}
		if lab, ok := a.svc.Catalog().Get(s.Lab); ok && lab.Home != nil {
			v.Home.Path = lab.Home.MountPath
		}
	}
	if !s.ReadyAt.IsZero() {
		t := s.ReadyAt
		v.ReadyAt = &t
	}
	if !s.FinishedAt.IsZero() {
		t := s.FinishedAt
		v.FinishedAt = &t
	}
	for _, n := range s.Nodes {
		phase, reason := nodePhase(n), ""
		if phase == PhaseUnschedulable {
			reason = n.Unschedulable
		}
		v.Nodes = append(v.Nodes, nodeJSON{Name: n.Name, Role: n.Role, Ready: n.Ready, Phase: phase, PhaseReason: reason, SSH: sshJSON{
			Host: n.SSHHost, Port: n.SSHPort, User: labs.SSHUser, KnownHosts: s.KnownHostsLine(n.SSHHost, n.SSHPort),
		}})
	}
	return v
}

// waitingView renders a place in the line as a queued session: startedAt
// is when the student joined, there is no lifetime, end or node yet, and
// the place's ETAs are in whole seconds, rounded up (an ETA under a second
// is never shown as 0 while the wait is not over). The private key is
// there only in the answer to the open that joined the line.
func (a *API) waitingView(q line.Waiting) sessionJSON {
	pos, eta, latest := q.Place.Position, ceilSeconds(q.Place.ETA), ceilSeconds(q.Place.ETALatest)
	return sessionJSON{
		ID: q.ID, Student: q.Student, Lab: q.Lab, Kind: string(q.Kind), Status: StatusQueued,
		StartedAt: q.JoinedAt, ServerTime: a.now().UTC(), Nodes: []nodeJSON{},
		StudentKey: q.StudentKey, PrivateKey: q.StudentPrivateKey,
		QueuePosition: &pos, ETASeconds: &eta, ETALatestSeconds: &latest,
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

func itoa(n int) string { return strconv.Itoa(n) }

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
