package httpapi

import (
	"fmt"
	"net/http"

	"github.com/google/uuid"

	"labkeep/shared/access"
	"labkeep/shared/alerts"
)

// AdminOptions configures guardian's alert endpoint and the admin
// console's endpoints (WithAdmin).
type AdminOptions struct {
	// Alerts keeps what guardian posts.
	Alerts alerts.Store
	// Limits bound every alert and how many a session keeps.
	Limits alerts.Limits
	// Key verifies each workspace's webhook credentials.
	Key alerts.Key
}

// GuardianAlertPath is where guardian posts its alerts.
const GuardianAlertPath = "/guardianAlert"

// adminRoutes lists the paths of WithAdmin with their only method.
var adminRoutes = map[string]string{
	GuardianAlertPath: http.MethodPost,
	"/adminSessions":  http.MethodGet,
	"/adminAlerts":    http.MethodGet,
}

// WithAdmin returns a handler serving, in front of next:
//   - POST /guardianAlert, where a workspace's guardian delivers its
//     alerts (GUARDIAN_WEBHOOK_URL). It authenticates with HTTP Basic
//     credentials, the session id and that session's token
//     (alerts.Key.Token), which the Kubernetes adapter writes into the
//     workspace Pod's webhook URL: a workspace can post alerts for its own
//     session only, until Limits.AfterEnd after the session ended (then
//     401). A valid alert is stored with the session (201); a bad one is
//     refused with 400 invalid_alert, one past the session's rate with 429
//     too_many_alerts and when to retry, and nothing is stored.
//   - GET /adminSessions (every live session, with its alert count) and
//     GET /adminAlerts (the newest alerts, ?session= for one session's,
//     ?limit= up to 500), for admins.
func (a *API) WithAdmin(o AdminOptions, next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(GuardianAlertPath, func(w http.ResponseWriter, r *http.Request) { a.guardianAlert(w, r, o) })
	mux.HandleFunc("/adminSessions", func(w http.ResponseWriter, r *http.Request) { a.adminSessions(w, r, o.Alerts) })
	mux.HandleFunc("/adminAlerts", func(w http.ResponseWriter, r *http.Request) { a.adminAlerts(w, r, o.Alerts) })
	mux.Handle("/", next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.refuseMethod(adminRoutes, w, r) {
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// guardianAlert authenticates the workspace, checks the alert against the
// limits and stores it; any failure stores nothing.
func (a *API) guardianAlert(w http.ResponseWriter, r *http.Request, o AdminOptions) {
	id, token, ok := r.BasicAuth()
	if parsed, err := uuid.Parse(id); !ok || err != nil || parsed.String() != id || !o.Key.Verify(id, token) {
		a.writeError(w, r, fmt.Errorf("%w: guardianAlert needs a workspace's webhook credentials (HTTP Basic: its session id and token)", access.ErrUnauthorized), nil)
		return
	}
	// Exactly what guardian posts: the session is the credentials', and
	// the arrival time labkeep's, never the sender's to choose.
	var req alerts.Posted
	if err := decodeBody(w, r, &req, true); err != nil {
		a.writeError(w, r, err, nil)
		return
	}
	req.First, req.Last = req.First.UTC(), req.Last.UTC()
	al := alerts.Alert{Session: id, Posted: req, Received: a.now().UTC()}
	if err := o.Limits.Check(al); err != nil {
		a.writeError(w, r, err, nil)
		return
	}
	stored, err := o.Alerts.AddAlert(r.Context(), al, o.Limits)
	if err != nil {
		a.writeError(w, r, err, nil)
		return
	}
	a.log.Info("guardian alert", "session", id, "kind", stored.Kind, "severity", stored.Severity, "id", stored.ID)
	writeJSON(w, http.StatusCreated, map[string]int64{"id": stored.ID})
}
