// Package alerts is the domain of the alerts a workspace's guardian raises
// (a memory hog killed, a fork bomb contained, a listener taken back) as
// labkeep receives and keeps them: what one is, the bounds an alert must
// keep to be stored, how many a session keeps, and the per-session
// credential guardian's webhook authenticates with.
//
// guardian and labkeep are two products that share no Go package: they
// meet at the wire. The alert guardian posts is described once, as the
// GuardianAlert schema of POST /guardianAlert in labkeep's OpenAPI
// document (shared/httpapi/openapi.yaml), with an example. Posted is this
// side's reading of it; guardian's sender and this receiver each test
// themselves against that description, so either drifting from it fails
// its own tests.
//
// The credential is derived, not stored (shared/workspacekey): Token is an
// HMAC of the session id under labkeep's workspace key, so it is known only
// to labkeep and to the one workspace Pod it was put into, a workspace's
// token is worth nothing for any other session, and nothing secret sits in
// the database.
package alerts

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"labkeep/shared/setting"
	"labkeep/shared/workspacekey"
)

// Severity grades an alert, as guardian does.
type Severity string

// The severities guardian sends; Check refuses any other.
const (
	Info     Severity = "info"
	Warning  Severity = "warning"
	Critical Severity = "critical"
)

// Posted is an alert exactly as a workspace's guardian posts it to POST
// /guardianAlert (the GuardianAlert schema): repeats within guardian's
// aggregation window are counted in Count between First and Last. It
// carries no session: that is the sender's credentials', never its body's.
type Posted struct {
	// Kind is machine-readable, e.g. "memory-kill".
	Kind string `json:"kind"`
	// Subject is what the alert is about (a PID, a path), part of
	// guardian's aggregation key.
	Subject  string            `json:"subject"`
	Severity Severity          `json:"severity"`
	Message  string            `json:"message"`
	Fields   map[string]string `json:"fields,omitempty"`
	// Workspace names the workspace guardian guards.
	Workspace string    `json:"workspace"`
	First     time.Time `json:"first"`
	Last      time.Time `json:"last"`
	// Count is how many occurrences guardian aggregated into the alert.
	Count int `json:"count"`
}

// Alert is one alert as labkeep keeps it: what guardian posted, with the
// session it came from (its credentials') and when it arrived. Its JSON is
// the Alert schema: Posted's fields between the id and session and the
// arrival time.
type Alert struct {
	ID      int64  `json:"id"`
	Session string `json:"session"`
	Posted
	Received time.Time `json:"received"`
}

// Limits bound what one alert may carry and how many a session keeps.
type Limits struct {
	// MaxText is the most bytes of the subject, the message, the
	// workspace and each field value. It must be at least guardian's
	// GUARDIAN_ALERT_MAX_TEXT, or guardian's longest alerts are refused.
	MaxText int
	// MaxFields is the most fields an alert may have (guardian's
	// GUARDIAN_ALERT_MAX_FIELDS or more).
	MaxFields int
	// PerSession is how many alerts a session keeps: the newest, the
	// older ones deleted as new ones arrive.
	PerSession int
}

// MaxKind bounds the kind and every field name: guardian chooses them, and
// they are short words ("memory-kill", "pid").
const MaxKind = 64

// DefaultLimits are guardian's own defaults for text and fields (512 bytes,
// 16 fields) and 200 alerts per session, as many as guardian itself keeps.
func DefaultLimits() Limits { return Limits{MaxText: 512, MaxFields: 16, PerSession: 200} }

// Validate checks the limits themselves; errors name the field
// (setting.Error).
func (l Limits) Validate() error {
	return errors.Join(setting.AtLeast("MaxText", l.MaxText, 64), setting.AtLeast("MaxFields", l.MaxFields, 1),
		setting.AtLeast("PerSession", l.PerSession, 1))
}

// ErrInvalid is an alert that breaks a bound; nothing of it is stored.
var ErrInvalid = errors.New("invalid_alert")

// Check returns an ErrInvalid naming the first field at fault, or nil.
// Texts must be valid UTF-8 without control characters (guardian replaces
// them before sending, so one here was not sent by guardian) and within
// the bounds; kind is required; severity is one of guardian's.
func (l Limits) Check(a Alert) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
	}
	if a.Kind == "" {
		return bad(`"kind" is required`)
	}
	switch a.Severity {
	case Info, Warning, Critical:
	default:
		return bad(`"severity" must be info, warning or critical, got %q`, clip(string(a.Severity)))
	}
	if len(a.Fields) > l.MaxFields {
		return bad("%d fields, at most %d", len(a.Fields), l.MaxFields)
	}
	texts := []text{{"kind", a.Kind, MaxKind}, {"subject", a.Subject, l.MaxText}, {"message", a.Message, l.MaxText}, {"workspace", a.Workspace, l.MaxText}}
	for k, v := range a.Fields {
		texts = append(texts, text{"field name", k, MaxKind}, text{"field " + clip(k), v, l.MaxText})
	}
	for _, t := range texts {
		if err := t.check(); err != nil {
			return bad("%s %v", t.name, err)
		}
	}
	if a.Count < 1 {
		return bad(`"count" must be at least 1, got %d`, a.Count)
	}
	if a.First.IsZero() || a.Last.Before(a.First) {
		return bad(`"first" is required and "last" may not be before it`)
	}
	return nil
}

// text is one text of an alert with its bound.
type text struct {
	name, value string
	max         int
}

func (t text) check() error {
	switch s := t.value; {
	case len(s) > t.max:
		return fmt.Errorf("is %d bytes, at most %d", len(s), t.max)
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return errors.New("holds a control character")
	}
	return nil
}

// clip keeps an echoed value short in an error message.
func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}

// Store keeps alerts; pgstore implements it.
type Store interface {
	// AddAlert stores a under its session and deletes that session's
	// alerts beyond the keep newest, in one transaction. It returns the
	// stored alert (with its id) or session.ErrNoSession if there is no
	// such session.
	AddAlert(ctx context.Context, a Alert, keep int) (Alert, error)
	// Alerts returns up to limit alerts, newest first: the session's,
	// or every session's when session is empty.
	Alerts(ctx context.Context, session string, limit int) ([]Alert, error)
	// Counts returns how many alerts each of sessions keeps (sessions
	// without any are left out).
	Counts(ctx context.Context, sessions []string) (map[string]int, error)
}

// Key derives the per-session webhook credentials: workspacekey's Alert
// use of labkeep's workspace key. Its zero value derives none (Enabled is
// false).
type Key workspacekey.Key

// Enabled reports whether the key can derive tokens.
func (k Key) Enabled() bool { return workspacekey.Key(k).Enabled() }

// Token is session's webhook credential.
func (k Key) Token(session string) string {
	return workspacekey.Key(k).Token(workspacekey.Alert, session)
}

// Verify reports, in constant time, whether token is session's.
func (k Key) Verify(session, token string) bool {
	return workspacekey.Key(k).Verify(workspacekey.Alert, session, token)
}

// ErrBadWebhookURL is a webhook base URL labkeep cannot hand to guardian.
var ErrBadWebhookURL = errors.New("must be an absolute http or https URL without user info, query or fragment")

// CheckWebhookURL checks base, the address of labkeep's alert endpoint as
// guardian reaches it.
func CheckWebhookURL(base string) error {
	u, err := url.Parse(base)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadWebhookURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%w, got %q", ErrBadWebhookURL, base)
	}
	return nil
}

// WebhookURL is what guardian of session's workspace posts to: base with
// the session id and its token as the URL's user info, which Go's HTTP
// client (guardian's) sends as HTTP Basic credentials and no proxy or
// access log records as part of the path or query.
func (k Key) WebhookURL(base, session string) string {
	u, err := url.Parse(base)
	if err != nil {
		return ""
	}
	u.User = url.UserPassword(session, k.Token(session))
	return u.String()
}
