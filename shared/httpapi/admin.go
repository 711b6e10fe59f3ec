package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/google/uuid"

	"labkeep/shared/access"
	"labkeep/shared/alerts"
	"labkeep/shared/labs"
	"labkeep/shared/reap"
	"labkeep/shared/seating"
)

// Bounds of GET /adminAlerts' limit.
const (
	DefaultAdminAlerts = 100
	MaxAdminAlerts     = 500
)

// adminSessionJSON is a live session as the admin console lists it: the
// session as an admin sees it and how many guardian alerts it keeps.
type adminSessionJSON struct {
	sessionJSON
	Alerts int `json:"alerts"`
}

// adminSessions answers every live student's session as an admin sees it
// (student, lab, status, time left, nodes, alerts kept), oldest first;
// unclaimed warm-pool instances are adminStatus's pools, not sessions.
func (a *API) adminSessions(w http.ResponseWriter, r *http.Request, store alerts.Store) {
	if !a.admin(w, r) {
		return
	}
	if len(r.URL.Query()) > 0 {
		a.writeError(w, r, fmt.Errorf("%w: %s takes no query parameters", access.ErrBadRequest, r.URL.Path), nil)
		return
	}
	live, err := a.svc.ListLive(r.Context())
	if err != nil {
		a.writeError(w, r, err, nil)
		return
	}
	ids := make([]string, len(live))
	for i, s := range live {
		ids[i] = s.ID
	}
	counts, err := store.Counts(r.Context(), ids)
	if err != nil {
		a.writeError(w, r, err, nil)
		return
	}
	p := access.Principal{Role: access.RoleAdmin} // a.admin let only admins through
	out := struct {
		Sessions []adminSessionJSON `json:"sessions"`
	}{Sessions: []adminSessionJSON{}}
	for _, s := range live {
		if s.Pool.Unclaimed() {
			continue // adminStatus's pools counts unclaimed instances
		}
		out.Sessions = append(out.Sessions, adminSessionJSON{sessionJSON: a.view(s, p), Alerts: counts[s.ID]})
	}
	writeJSON(w, http.StatusOK, out)
}

// adminAlerts answers the newest guardian alerts, every session's or
// (?session=) one session's, at most ?limit= (DefaultAdminAlerts, up to
// MaxAdminAlerts).
func (a *API) adminAlerts(w http.ResponseWriter, r *http.Request, store alerts.Store) {
	if !a.admin(w, r) {
		return
	}
	q := r.URL.Query()
	for k := range q {
		if k != "session" && k != "limit" {
			a.writeError(w, r, fmt.Errorf("%w: unknown query parameter %q (allowed: session, limit)", access.ErrBadRequest, k), nil)
			return
		}
	}
	id, limit := q.Get("session"), DefaultAdminAlerts
	if _, err := uuid.Parse(id); id != "" && err != nil {
		a.writeError(w, r, fmt.Errorf("%w: session %q is not a session id", access.ErrBadRequest, id), nil)
		return
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxAdminAlerts {
			a.writeError(w, r, fmt.Errorf("%w: limit must be a number from 1 to %d, got %q", access.ErrBadRequest, MaxAdminAlerts, s), nil)
			return
		}
		limit = n
	}
	list, err := store.Alerts(r.Context(), id, limit)
	if err != nil {
		a.writeError(w, r, err, nil)
		return
	}
	if list == nil {
		list = []alerts.Alert{}
	}
	writeJSON(w, http.StatusOK, struct {
		Alerts []alerts.Alert `json:"alerts"`
	}{list})
}

// adminStatusJSON is GET /adminStatus: the reaper's status and, per lab,
// the waitlist and the warm pool.
type adminStatusJSON struct {
	reap.Status
	Queues []queueJSON `json:"queues"`
	// Pools is every lab's warm pool (seating.Usher.Pools): its
	// target now, idle (ready), starting and claimed instances.
	Pools []seating.PoolStatus `json:"pools"`
}

// queueJSON is one lab's line (seating.QueueStat): how many students
// wait and how long the earliest has waited, in whole seconds rounded up.
type queueJSON struct {
	Lab               string `json:"lab"`
	Length            int    `json:"length"`
	OldestWaitSeconds int64  `json:"oldestWaitSeconds"`
}

// Seats is the line and the warm pool as adminStatus reads them
// (seating.Usher).
type Seats interface {
	QueueStats(ctx context.Context) ([]seating.QueueStat, error)
	Pools(ctx context.Context) ([]seating.PoolStatus, error)
	// InUse is how much of each capacity bucket is in use now.
	InUse(ctx context.Context) (map[labs.Kind]int, error)
}

// adminStatus is st with every lab's line and warm pool (Seats).
func (a *API) adminStatus(r *http.Request, st reap.Status) (adminStatusJSON, error) {
	if a.seats == nil {
		return adminStatusJSON{Status: st, Queues: []queueJSON{}, Pools: []seating.PoolStatus{}}, nil
	}
	stats, err := a.seats.QueueStats(r.Context())
	if err != nil {
		return adminStatusJSON{}, fmt.Errorf("waitlist: %w", err)
	}
	pools, err := a.seats.Pools(r.Context())
	if err != nil {
		return adminStatusJSON{}, fmt.Errorf("warm pool: %w", err)
	}
	return adminStatusJSON{Status: st, Queues: queuesJSON(stats), Pools: pools}, nil
}

// queuesJSON renders stats, never null.
func queuesJSON(stats []seating.QueueStat) []queueJSON {
	out := []queueJSON{}
	for _, q := range stats {
		out = append(out, queueJSON{Lab: q.Lab, Length: q.Length, OldestWaitSeconds: ceilSeconds(q.OldestWait)})
	}
	return out
}
