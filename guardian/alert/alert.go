// Package alert aggregates guardian's alerts, keeps the recent ones for the
// API and delivers them to the platform's webhook, rate-limited and with
// retries. Repeats of the same alert within the aggregation window are
// counted on the first one instead of being sent again, so a workspace in
// trouble cannot flood the platform.
package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Severity grades an alert.
type Severity string

// Severities.
const (
	Info     Severity = "info"
	Warning  Severity = "warning"
	Critical Severity = "critical"
)

// Alert is one aggregated alert.
type Alert struct {
	Kind      string            `json:"kind"`    // machine-readable, e.g. "memory-kill"
	Subject   string            `json:"subject"` // what it is about, part of the aggregation key
	Severity  Severity          `json:"severity"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields,omitempty"`
	Workspace string            `json:"workspace"`
	First     time.Time         `json:"first"`
	Last      time.Time         `json:"last"`
	Count     int               `json:"count"` // occurrences aggregated into this alert
}

// Config tunes aggregation, rate limiting and delivery.
type Config struct {
	Workspace   string        // names the workspace in every alert
	Window      time.Duration // same kind+subject within Window aggregate; default 60s
	Keep        int           // recent alerts kept for GET /alerts; default 200
	MaxText     int           // bytes of the subject, the message and each field value; default 512
	MaxFields   int           // fields kept per alert; default 16
	RatePerMin  int           // webhook deliveries per minute; default 20
	Burst       int           // deliveries allowed at once; default 5
	WebhookURL  string        // empty: no delivery, alerts stay in the API only
	Attempts    int           // delivery attempts per alert; default 5
	Backoff     time.Duration // first retry delay, doubled each time; default 500ms
	HTTPTimeout time.Duration // per attempt; default 5s
}

// Defaults returns the standard tuning: a 60 s aggregation window, the
// last 200 alerts kept, at most 512 bytes per text and 16 fields per alert,
// 20 deliveries a minute with bursts of 5, 5 attempts per alert starting
// at a 500 ms backoff, 5 s per attempt.
func Defaults() Config {
	return Config{Window: time.Minute, Keep: 200, MaxText: 512, MaxFields: 16, RatePerMin: 20, Burst: 5, Attempts: 5,
		Backoff: 500 * time.Millisecond, HTTPTimeout: 5 * time.Second}
}

// defaults fills every unset (zero or negative) tunable from Defaults.
func (c *Config) defaults() {
	d := Defaults()
	if c.Window <= 0 {
		c.Window = d.Window
	}
	if c.Keep <= 0 {
		c.Keep = d.Keep
	}
	if c.MaxText <= 0 {
		c.MaxText = d.MaxText
	}
	if c.MaxFields <= 0 {
		c.MaxFields = d.MaxFields
	}
	if c.RatePerMin <= 0 {
		c.RatePerMin = d.RatePerMin
	}
	if c.Burst <= 0 {
		c.Burst = d.Burst
	}
	if c.Attempts <= 0 {
		c.Attempts = d.Attempts
	}
	if c.Backoff <= 0 {
		c.Backoff = d.Backoff
	}
	if c.HTTPTimeout <= 0 {
		c.HTTPTimeout = d.HTTPTimeout
	}
}

// Stats counts what happened to alerts, for metrics.
type Stats struct {
	Raised, Aggregated, Delivered, Failed, RateLimited uint64
}

// Aggregator collects alerts. Its zero value is not usable; call New.
type Aggregator struct {
	cfg    Config
	now    func() time.Time
	client *http.Client
	log    *slog.Logger

	mu     sync.Mutex
	recent []Alert // oldest first
	tokens float64
	refill time.Time
	stats  Stats
	queue  chan Alert
	onNew  func(Alert)
}

// New returns an aggregator. now is the clock; client may be nil for
// http.DefaultClient. Call Run to deliver to the webhook.
func New(cfg Config, now func() time.Time, client *http.Client, log *slog.Logger) *Aggregator {
	cfg.defaults()
	if client == nil {
		client = http.DefaultClient
	}
	return &Aggregator{cfg: cfg, now: now, client: client, log: log, tokens: float64(cfg.Burst), refill: now(), queue: make(chan Alert, 256)}
}

// OnRaise registers a callback run (outside the lock) for every alert that
// is new rather than aggregated; guardian uses it to persist state.
func (a *Aggregator) OnRaise(f func(Alert)) { a.onNew = f }

// Raise records an alert. A repeat of the same kind and subject within the
// window only increments the count of the existing alert. A new alert is
// queued for the webhook if the rate limit allows or it is critical;
// otherwise it is kept for the API and counted as rate-limited.
//
// Subject, message and fields often carry what the workspace's user chose
// (paths, process names), which ends up in guardian's state file and the
// platform's alert store: they are bounded (see Bound) before anything
// keeps them.
func (a *Aggregator) Raise(kind, subject string, sev Severity, msg string, fields map[string]string) {
	kind = Bound(kind, a.cfg.MaxText)
	subject, msg, fields = Bound(subject, a.cfg.MaxText), Bound(msg, a.cfg.MaxText), a.boundFields(fields)
	now := a.now()
	a.mu.Lock()
	a.stats.Raised++
	for i := len(a.recent) - 1; i >= 0; i-- {
		r := &a.recent[i]
		if r.Kind == kind && r.Subject == subject && now.Sub(r.Last) < a.cfg.Window {
			r.Count++
			r.Last = now
			r.Message = msg
			r.Fields = fields
			a.stats.Aggregated++
			a.mu.Unlock()
			return
		}
	}
	al := Alert{Kind: kind, Subject: subject, Severity: sev, Message: msg, Fields: fields, Workspace: a.cfg.Workspace, First: now, Last: now, Count: 1}
	a.recent = append(a.recent, al)
	if len(a.recent) > a.cfg.Keep {
		a.recent = a.recent[len(a.recent)-a.cfg.Keep:]
	}
	// A critical alert stands for something guardian did or could not do
	// (a kill, a freeze, sshd gone) and is what the platform must see, so
	// the rate limit never holds one back (it still spends a token when
	// one is left): a burst of warnings under load must not hide the
	// memory-kill that follows it. Aggregation by kind and subject and
	// guardian's own kill budget bound how many there are.
	send := a.cfg.WebhookURL != "" && (a.take(now) || sev == Critical)
	if a.cfg.WebhookURL != "" && !send {
		a.stats.RateLimited++
	}
	onNew := a.onNew
	a.mu.Unlock()
	if a.log != nil {
		a.log.Warn("alert", "kind", kind, "subject", subject, "severity", sev, "message", msg)
	}
	if send {
		select {
		case a.queue <- al:
		default:
			a.mu.Lock()
			a.stats.RateLimited++
			a.mu.Unlock()
		}
	}
	if onNew != nil {
		onNew(al)
	}
}

// take consumes a delivery token (token bucket refilled at RatePerMin).
func (a *Aggregator) take(now time.Time) bool {
	a.tokens += now.Sub(a.refill).Minutes() * float64(a.cfg.RatePerMin)
	a.refill = now
	if a.tokens > float64(a.cfg.Burst) {
		a.tokens = float64(a.cfg.Burst)
	}
	if a.tokens < 1 {
		return false
	}
	a.tokens--
	return true
}

// Recent returns the kept alerts, oldest first.
func (a *Aggregator) Recent() []Alert {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Alert(nil), a.recent...)
}

// Restore replaces the kept alerts, for a restarted guardian taking up its
// persisted state.
// They are bounded like raised ones, the newest Keep of them kept: a state
// file written by another version must not bring unbounded text back.
func (a *Aggregator) Restore(alerts []Alert) {
	if len(alerts) > a.cfg.Keep {
		alerts = alerts[len(alerts)-a.cfg.Keep:]
	}
	recent := make([]Alert, len(alerts))
	for i, al := range alerts {
		al.Kind, al.Subject, al.Message = Bound(al.Kind, a.cfg.MaxText), Bound(al.Subject, a.cfg.MaxText), Bound(al.Message, a.cfg.MaxText)
		al.Workspace, al.Fields = Bound(al.Workspace, a.cfg.MaxText), a.boundFields(al.Fields)
		recent[i] = al
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recent = recent
}

// TruncatedFields is the field that counts the fields an alert had beyond
// MaxFields.
const TruncatedFields = "truncated_fields"

// boundFields returns a copy of fields with every key and value bounded;
// beyond MaxFields (counting TruncatedFields) only the first keys in
// sorted order are kept and TruncatedFields says how many were dropped.
func (a *Aggregator) boundFields(fields map[string]string) map[string]string {
	if fields == nil {
		return nil
	}
	keys := slices.Sorted(maps.Keys(fields))
	keep := len(keys)
	if keep > a.cfg.MaxFields {
		keep = max(a.cfg.MaxFields-1, 0)
	}
	out := make(map[string]string, keep+1)
	for _, k := range keys[:keep] {
		out[Bound(k, maxKey)] = Bound(fields[k], a.cfg.MaxText)
	}
	if dropped := len(keys) - keep; dropped > 0 {
		out[TruncatedFields] = strconv.Itoa(dropped)
	}
	return out
}

// maxKey bounds field names, which guardian chooses but Restore reads
// back from a file.
const maxKey = 64

// truncMarker ends a text Bound cut short.
const truncMarker = "…[truncated]"

// Bound makes s safe to keep and show: every control character (newlines
// and terminal escapes included) and every invalid UTF-8 byte becomes '?',
// and a text longer than max bytes is cut at a character boundary and ends
// with "…[truncated]", the whole within max bytes (max is raised to the
// marker's length, so the marker always fits).
func Bound(s string, max int) string {
	clean := strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
	if len(clean) <= max {
		return clean
	}
	cut := max - len(truncMarker)
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(clean[cut]) {
		cut--
	}
	return clean[:cut] + truncMarker
}

// Stats returns delivery counters.
func (a *Aggregator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// Run delivers queued alerts to the webhook until ctx ends. Each alert is
// POSTed as JSON; network errors, 429 and 5xx are retried with doubling
// backoff up to Attempts, other 4xx are not (the request itself is wrong).
func (a *Aggregator) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case al := <-a.queue:
			err := a.deliver(ctx, al)
			a.mu.Lock()
			if err != nil {
				a.stats.Failed++
			} else {
				a.stats.Delivered++
			}
			a.mu.Unlock()
			if err != nil && a.log != nil {
				a.log.Error("alert delivery failed", "kind", al.Kind, "err", err)
			}
		}
	}
}

func (a *Aggregator) deliver(ctx context.Context, al Alert) error {
	body, err := json.Marshal(al)
	if err != nil {
		return err
	}
	backoff := a.cfg.Backoff
	var last error
	for attempt := 1; attempt <= a.cfg.Attempts; attempt++ {
		retry, err := a.post(ctx, body)
		if err == nil {
			return nil
		}
		last = err
		if !retry || attempt == a.cfg.Attempts {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff *= 2
	}
	return last
}

func (a *Aggregator) post(ctx context.Context, body []byte) (retry bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.HTTPTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.cfg.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return true, err
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode < 300:
		return false, nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return true, fmt.Errorf("webhook: %s", resp.Status)
	default:
		return false, fmt.Errorf("webhook refused the alert: %s", resp.Status)
	}
}
