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

	"labkeep/shared/access"
	"labkeep/shared/rate"
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
	// PerWindow alerts a session's workspace may post in any Window
	// (0: no bound); past it, 429 too_many_alerts with Retry-After, and
	// nothing is stored. guardian aggregates repeats and retries a 429
	// with backoff, so it is a workspace posting by itself (its root holds
	// the credentials) that meets the bound; each post is a database
	// write. Counted from the alerts the session keeps, so PerWindow is
	// at most PerSession.
	PerWindow int
	Window    time.Duration
	// AfterEnd is how long after its session ended a workspace's alerts
	// are still taken: guardian's last alerts while its Pod is deleted.
	// Later its credentials are refused (401): a derived credential cannot
	// be revoked, so it expires with its session.
	AfterEnd time.Duration
}

// MaxKind bounds the kind and every field name: guardian chooses them, and
// they are short words ("memory-kill", "pid").
const MaxKind = 64

// DefaultLimits are guardian's own defaults for text and fields (512 bytes,
// 16 fields), 200 alerts per session, as many as guardian itself keeps,
// 60 a minute (guardian sends one per kind and subject per aggregation
// window), and 5 minutes after the session's end.
func DefaultLimits() Limits {
	return Limits{MaxText: 512, MaxFields: 16, PerSession: 200, PerWindow: 60, Window: time.Minute, AfterEnd: 5 * time.Minute}
}

// Validate checks the limits themselves; errors name the field
// (setting.Error).
func (l Limits) Validate() error {
	errs := []error{setting.AtLeast("MaxText", l.MaxText, 64), setting.AtLeast("MaxFields", l.MaxFields, 1),
		setting.AtLeast("PerSession", l.PerSession, 1), setting.AtLeast("PerWindow", l.PerWindow, 0)}
	if l.PerWindow > 0 {
		errs = append(errs, setting.Positive("Window", l.Window))
	}
	if l.PerWindow > l.PerSession {
		errs = append(errs, setting.Invalid("PerWindow", "%d is more than the %d alerts a session keeps (PerSession), which the rate is counted from",
			l.PerWindow, l.PerSession))
	}
	if l.AfterEnd < 0 {
		errs = append(errs, setting.Invalid("AfterEnd", "must not be negative, got %s", l.AfterEnd))
	}
	return errors.Join(errs...)
}

// Rate is PerWindow per Window as the rule that applies it.
func (l Limits) Rate() rate.Limit { return rate.Limit{Max: l.PerWindow, Per: l.Window} }

// ErrTooMany refuses an alert past the session's Rate; it wraps a
// *rate.Exceeded saying when the next is taken.
var ErrTooMany = errors.New("too_many_alerts")

// ErrEnded refuses an alert of a session that ended longer than AfterEnd
// ago: the workspace's credentials have expired with it.
var ErrEnded = fmt.Errorf("%w: the session's workspace credentials expired with it", access.ErrUnauthorized)

// Standing is what labkeep knows of a session when one of its alerts
// arrives, read under the session's alert lock.
type Standing struct {
	// Ended is when the session ended; zero while it is live.
	Ended time.Time
	// Recent are the arrival times of its kept alerts since
	// Rate().Since(now), newest first, at most PerWindow.
	Recent []time.Time
}

// Admit decides whether an alert arriving at now for a session in
// standing s is stored: refused with ErrEnded once the session ended
// longer than AfterEnd ago, with ErrTooMany past the rate.
func (l Limits) Admit(s Standing, now time.Time) error {
	if !s.Ended.IsZero() && now.Sub(s.Ended) > l.AfterEnd {
		return fmt.Errorf("%w (ended %s, alerts are taken %s after)", ErrEnded, s.Ended.UTC().Format(time.RFC3339), l.AfterEnd)
	}
	if err := l.Rate().Allow(s.Recent, now); err != nil {
		return fmt.Errorf("%w: %w", ErrTooMany, err)
	}
	return nil
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
	// AddAlert reads the session's Standing, asks l.Admit whether a is
	// taken at a.Received, stores it and deletes that session's alerts
	// beyond the l.PerSession newest, in one transaction under a lock of
	// the session's alerts (so two posts at once count each other). It
	// returns the stored alert (with its id), Admit's refusal, or
	// session.ErrNoSession if there is no such session.
	AddAlert(ctx context.Context, a Alert, l Limits) (Alert, error)
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
