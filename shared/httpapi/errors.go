package httpapi

import (
	"errors"
	"net/http"
	"time"

	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// Errors of the HTTP layer itself; their text is the error code.
var (
	ErrUnauthorized     = errors.New("unauthorized")
	ErrForbidden        = errors.New("forbidden")
	ErrBadRequest       = errors.New("bad_request")
	ErrTooLarge         = errors.New("too_large")
	ErrUnsupportedMedia = errors.New("unsupported_media_type")
	ErrMethodNotAllowed = errors.New("method_not_allowed")
	ErrNotFound         = errors.New("not_found")
)

// statusTable is the one place domain and HTTP errors get their status
// code; the code string is the sentinel's text. First match wins. Errors in
// no row are internal (500) and their text is not shown to callers.
var statusTable = []struct {
	err    error
	status int
}{
	{ErrUnauthorized, http.StatusUnauthorized},
	{ErrForbidden, http.StatusForbidden},
	{ErrBadRequest, http.StatusBadRequest},
	{ErrTooLarge, http.StatusRequestEntityTooLarge},
	{ErrUnsupportedMedia, http.StatusUnsupportedMediaType},
	{ErrMethodNotAllowed, http.StatusMethodNotAllowed},
	{ErrNotFound, http.StatusNotFound},
	{session.ErrUnknownLab, http.StatusBadRequest},
	{session.ErrSessionExists, http.StatusConflict},
	{session.ErrExtensionCap, http.StatusConflict},
	{session.ErrNotRunning, http.StatusConflict},
	{session.ErrNoSession, http.StatusNotFound},
	{session.ErrNoCapacity, http.StatusServiceUnavailable},
	{session.ErrProvisioning, http.StatusBadGateway},
	{reap.ErrBusy, http.StatusConflict},
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

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	// Session accompanies session_exists (the live session), no_capacity
	// and provisioning_failed (the failed session, with its reason).
	Session *sessionJSON `json:"session,omitempty"`
}

// writeError writes err as {"error":{"code","message"}} with its status.
// Internal errors are logged and shown only as "internal error".
func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error, sess *session.Session) {
	status, code := StatusOf(err)
	var body errorBody
	body.Error.Code, body.Error.Message = code, err.Error()
	if status == http.StatusInternalServerError {
		a.log.Error("internal error", "path", r.URL.Path, "err", err)
		body.Error.Message = "internal error"
	}
	switch status {
	case http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="labkeep"`)
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", retryAfter(a.retryAfter))
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", allowFor(r.URL.Path))
	}
	if sess != nil && sess.ID != "" {
		v := a.view(*sess)
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
