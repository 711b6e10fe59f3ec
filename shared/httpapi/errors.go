package httpapi

import (
	"errors"
	"net/http"
	"time"

	"labkeep/shared/access"
	"labkeep/shared/alerts"
	"labkeep/shared/rate"
	"labkeep/shared/reap"
	"labkeep/shared/reservation"
	"labkeep/shared/session"
	"labkeep/shared/termlimit"
)

// statusTable is the one place domain and HTTP errors get their status
// code; the code string is the sentinel's text. First match wins. Errors in
// no row are internal (500) and their text is not shown to callers.
var statusTable = []struct {
	err    error
	status int
}{
	{access.ErrUnauthorized, http.StatusUnauthorized},
	{access.ErrForbidden, http.StatusForbidden},
	{access.ErrBadRequest, http.StatusBadRequest},
	{access.ErrTooLarge, http.StatusRequestEntityTooLarge},
	{access.ErrUnsupportedMedia, http.StatusUnsupportedMediaType},
	{access.ErrMethodNotAllowed, http.StatusMethodNotAllowed},
	{access.ErrNotFound, http.StatusNotFound},
	{access.ErrBadGateway, http.StatusBadGateway},
	{session.ErrUnknownLab, http.StatusBadRequest},
	{session.ErrInvalidKey, http.StatusBadRequest},
	{session.ErrSessionExists, http.StatusConflict},
	{session.ErrHomeQuota, http.StatusConflict},
	{session.ErrHomeBusy, http.StatusConflict},
	{session.ErrExtensionCap, http.StatusConflict},
	{session.ErrNotRunning, http.StatusConflict},
	{session.ErrNoSession, http.StatusNotFound},
	{reap.ErrNoHome, http.StatusNotFound},
	{reap.ErrHomeInUse, http.StatusConflict},
	{session.ErrNoCapacity, http.StatusServiceUnavailable},
	{session.ErrProvisioning, http.StatusBadGateway},
	{reap.ErrBusy, http.StatusConflict},
	{alerts.ErrInvalid, http.StatusBadRequest},
	{reservation.ErrInvalid, http.StatusBadRequest},
	{reservation.ErrOverbooked, http.StatusConflict},
	{reservation.ErrNoReservation, http.StatusNotFound},
	{termlimit.ErrTooMany, http.StatusTooManyRequests},
	{session.ErrTooManyOpens, http.StatusTooManyRequests},
	{alerts.ErrTooMany, http.StatusTooManyRequests},
}

// skippedFor lists the errors that, answering the scheduler (reapTick),
// mean its run was skipped, not failed: the schedule did its job (another
// run is reaping right now), so reapTick answers 200 {"skipped": true}
// with the row's code instead of the status above.
var skippedFor = []error{reap.ErrBusy}

func skippedForScheduler(err error) bool {
	for _, e := range skippedFor {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// StatusOf returns the HTTP status and error code for err.
func StatusOf(err error) (status int, code string) {
	for _, row := range statusTable {
		if errors.Is(err, row.err) {
			return row.status, row.err.Error()
		}
	}
	return http.StatusInternalServerError, "internal"
}

// StatusOf is the package's StatusOf, for handlers served beside the API
// that answer through its table (the web terminal).
func (a *API) StatusOf(err error) (status int, code string) { return StatusOf(err) }

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	// Session accompanies session_exists (the live session), no_capacity
	// and provisioning_failed (the failed session, with its reason).
	Session *sessionJSON `json:"session,omitempty"`
}

// studentMessages replaces the error's text, for students, on the errors
// whose text can quote the API server or the database (ServiceAccount,
// quota and object names, admission messages): a student gets one fixed
// sentence per case, and the full error goes to the log with the session
// id. First match wins. Every other code's text is labkeep's own
// description of the request (what field is wrong, which labs exist, why
// an extension is refused) and is shown as is. Admins see every error in
// full.
var studentMessages = []struct {
	err error
	msg string
}{
	{session.ErrEndedWhileProvisioning, "the session was ended (closed, or cleaned up after waiting too long for capacity) while it was being provisioned; open the lab again if you still need it"},
	{session.ErrNoCapacity, session.Sentence(session.EndNoCapacity)},
	{session.ErrProvisioning, session.Sentence(session.EndProvisioningFailed)},
}

// messageFor returns what the caller p may read about err with status.
func (a *API) messageFor(p access.Principal, err error, status int) string {
	if p.Admin() {
		return err.Error()
	}
	if status == http.StatusInternalServerError {
		return "internal error"
	}
	for _, m := range studentMessages {
		if errors.Is(err, m.err) {
			return m.msg
		}
	}
	return err.Error()
}

// writeError writes err for a caller not (yet) authenticated, which is
// shown what a student would be.
func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error, sess *session.Session) {
	a.writeErrorFor(w, r, access.Principal{}, err, sess)
}

// writeErrorFor writes err as {"error":{"code","message"}} with its status,
// the message and any session rendered for caller p (see messageFor and
// view). Errors whose text is withheld from students are logged in full.
func (a *API) writeErrorFor(w http.ResponseWriter, r *http.Request, p access.Principal, err error, sess *session.Session) {
	status, code := StatusOf(err)
	var body errorBody
	body.Error.Code, body.Error.Message = code, a.messageFor(p, err, status)
	var id string
	if sess != nil {
		id = sess.ID
	}
	switch {
	case status == http.StatusInternalServerError:
		a.log.Error("internal error", "path", r.URL.Path, "session", id, "err", err)
	case status == http.StatusBadGateway:
		a.log.Warn("request failed", "path", r.URL.Path, "code", code, "session", id, "err", err)
	case status == http.StatusServiceUnavailable, status == http.StatusTooManyRequests:
		a.log.Info("request refused", "path", r.URL.Path, "code", code, "session", id, "err", err)
	}
	switch status {
	case http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="labkeep"`)
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		wait := a.retryAfter
		if ex := (*rate.Exceeded)(nil); errors.As(err, &ex) {
			wait = ex.RetryAfter // when the caller's next is allowed
		}
		w.Header().Set("Retry-After", retryAfter(wait))
	}
	if sess != nil && sess.ID != "" {
		v := a.view(*sess, p)
		body.Session = &v
	}
	writeJSON(w, status, body)
}

func retryAfter(d time.Duration) string {
	s := int(d.Round(time.Second) / time.Second)
	if s < 1 {
		s = 1
	}
	return itoa(s)
}
