package httpapi

import (
	"context"
	"crypto/subtle"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"labkeep/shared/access"
	"labkeep/shared/reap"
)

// ReaperRunner is the reaper as the HTTP layer needs it.
type ReaperRunner interface {
	RunOnce(ctx context.Context, trigger reap.Trigger) (reap.Report, error)
}

// ReaperStatus reads the data behind GET /adminStatus.
type ReaperStatus func(ctx context.Context) (reap.Status, error)

// ReaperOptions configures the reaper's endpoints.
type ReaperOptions struct {
	Reaper ReaperRunner
	// DryRun is the same reaper deleting nothing (reap.Config.DryRun),
	// run by POST /adminReapNow {"dryRun": true}; nil refuses dry runs.
	DryRun ReaperRunner
	Status ReaperStatus
	// SchedulerToken authenticates POST /reapTick (Authorization: Bearer
	// …). If empty, reapTick refuses every call: an unauthenticated
	// endpoint that deletes things is never the default.
	SchedulerToken string
	// HomeKeeper serves GET /homes and POST /adminDeleteHome, and with
	// Archiver GET /homeArchive (nil: no such routes).
	HomeKeeper HomeKeeper
	Archiver   HomeArchiver
	// Gatherer serves /metrics (nil: no /metrics route).
	Gatherer prometheus.Gatherer
	// MetricsToken authenticates GET /metrics (Authorization: Bearer …).
	// If empty, /metrics refuses every call: a scrape reads the database
	// (the live sessions, the seats), so an open /metrics on a public
	// address is a free way to load it, and what it tells (how many labs
	// run, how often opens fail) is the operator's.
	MetricsToken string
}

// reaperRoutes lists the reaper's paths with their only method.
var reaperRoutes = map[string]string{
	"/adminReapNow":    http.MethodPost,
	"/adminStatus":     http.MethodGet,
	"/reapTick":        http.MethodPost,
	"/metrics":         http.MethodGet,
	"/homes":           http.MethodGet,
	"/adminDeleteHome": http.MethodPost,
	"/homeArchive":     http.MethodGet,
}

// WithReaper returns a handler serving the reaper's endpoints —
// POST /adminReapNow (optionally {"dryRun": true}) and GET /adminStatus
// (admin JWT), POST /reapTick
// (scheduler token; any payload is accepted and ignored, so a CloudEvent,
// an EventBridge event or an empty body all work) and GET /metrics
// (metrics token) — in
// front of the session API, which serves every other path.
func (a *API) WithReaper(o ReaperOptions) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/adminReapNow", func(w http.ResponseWriter, r *http.Request) {
		if !a.admin(w, r) {
			return
		}
		// An empty body, or {"dryRun": bool}: a dry run reports what it
		// would delete and deletes nothing.
		var opts struct {
			DryRun bool `json:"dryRun"`
		}
		if err := decodeBody(w, r, &opts, false); err != nil {
			a.writeError(w, r, err, nil)
			return
		}
		rr := o.Reaper
		if opts.DryRun {
			if rr = o.DryRun; rr == nil {
				a.writeError(w, r, fmt.Errorf("%w: this server runs no dry reaper", access.ErrBadRequest), nil)
				return
			}
		}
		a.reapNow(w, r, rr, reap.TriggerAdmin)
	})
	mux.HandleFunc("/adminStatus", func(w http.ResponseWriter, r *http.Request) {
		if !a.admin(w, r) {
			return
		}
		st, err := o.Status(r.Context())
		if err != nil {
			a.writeError(w, r, err, nil)
			return
		}
		out, err := a.adminStatus(r, st)
		if err != nil {
			a.writeError(w, r, err, nil)
			return
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("/reapTick", func(w http.ResponseWriter, r *http.Request) {
		if !bearerAuthorized(r, o.SchedulerToken) {
			a.writeError(w, r, fmt.Errorf("%w: reapTick needs the scheduler token", access.ErrUnauthorized), nil)
			return
		}
		// Drain what the scheduler sent (bounded), without interpreting it.
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, MaxBodyBytes))
		a.reapNow(w, r, o.Reaper, reap.TriggerSchedule)
	})
	if o.Gatherer != nil {
		mux.Handle("/metrics", a.Metrics(o.Gatherer, o.MetricsToken))
	}
	if o.HomeKeeper != nil {
		mux.HandleFunc("/homes", func(w http.ResponseWriter, r *http.Request) { a.homes(w, r, o.HomeKeeper) })
		mux.HandleFunc("/adminDeleteHome", func(w http.ResponseWriter, r *http.Request) { a.adminDeleteHome(w, r, o.HomeKeeper) })
		if o.Archiver != nil {
			mux.HandleFunc("/homeArchive", func(w http.ResponseWriter, r *http.Request) { a.homeArchive(w, r, o.HomeKeeper, o.Archiver) })
		}
	}
	mux.Handle("/", a)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.refuseMethod(reaperRoutes, w, r) {
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Metrics serves g's exposition to callers bearing token (Authorization:
// Bearer …, compared in constant time) and answers every other call 401
// unauthorized; with token empty, every call. A listener that needs no
// token (one only the cluster reaches) serves promhttp's handler itself.
func (a *API) Metrics(g prometheus.Gatherer, token string) http.Handler {
	metrics := promhttp.HandlerFor(g, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !bearerAuthorized(r, token) {
			a.writeError(w, r, fmt.Errorf("%w: /metrics needs the metrics token", access.ErrUnauthorized), nil)
			return
		}
		metrics.ServeHTTP(w, r)
	})
}

// admin authenticates r and requires the admin role (403 for students).
func (a *API) admin(w http.ResponseWriter, r *http.Request) bool {
	_, ok := a.adminCaller(w, r)
	return ok
}

// adminCaller authenticates r and requires the admin role (401 or 403
// written otherwise), returning the admin.
func (a *API) adminCaller(w http.ResponseWriter, r *http.Request) (access.Principal, bool) {
	return a.callerWhere(w, r, access.Principal.Admin, "the admin role")
}

// callerWhere authenticates r and requires may of the caller (401, or 403
// saying the path needs roles, written otherwise), returning the caller.
func (a *API) callerWhere(w http.ResponseWriter, r *http.Request, may func(access.Principal) bool, roles string) (access.Principal, bool) {
	p, ok := a.Authenticate(w, r)
	if !ok {
		return p, false
	}
	if !may(p) {
		a.writeError(w, r, fmt.Errorf("%w: %s needs %s", access.ErrForbidden, r.URL.Path, roles), nil)
		return p, false
	}
	return p, true
}

// Skipped is reapTick's answer when the run did not happen for a reason
// that is no failure of the schedule (see skippedForScheduler): 200, so a
// scheduler neither retries nor alerts.
type Skipped struct {
	Trigger reap.Trigger `json:"trigger"`
	Skipped bool         `json:"skipped"`
	// Code and Message say why, as the error would for another caller.
	Code    string `json:"code"`
	Message string `json:"message"`
}

// reapNow runs the reaper for trigger t and answers its report. A
// scheduled run skipped (another run already going) is 200 skipped:true;
// the admin button gets the error's own status (409 busy), because a
// person pressing it wants to know the run they asked for did not happen.
func (a *API) reapNow(w http.ResponseWriter, r *http.Request, rr ReaperRunner, t reap.Trigger) {
	report, err := rr.RunOnce(r.Context(), t)
	if err != nil {
		if t == reap.TriggerSchedule && skippedForScheduler(err) {
			_, code := StatusOf(err)
			writeJSON(w, http.StatusOK, Skipped{Trigger: t, Skipped: true, Code: code, Message: err.Error()})
			return
		}
		a.writeError(w, r, err, nil)
		return
	}
	writeJSON(w, http.StatusOK, report)
}

// bearerAuthorized reports whether r carries token as its bearer token,
// compared in constant time; an empty token authorizes nothing.
func bearerAuthorized(r *http.Request, token string) bool {
	if token == "" {
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}
