package alert

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"labkeep/guardian/internal/poll"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestAggregation(t *testing.T) {
	c := &clock{time.Unix(1000, 0)}
	a := New(Config{Workspace: "ws1", Window: time.Minute}, c.now, nil, nil)
	a.Raise("memory-alert", "", Warning, "95%", nil)
	c.t = c.t.Add(30 * time.Second)
	a.Raise("memory-alert", "", Warning, "96%", nil)
	a.Raise("sshd-gone", "", Critical, "gone", nil)
	c.t = c.t.Add(61 * time.Second)
	a.Raise("memory-alert", "", Warning, "97%", nil) // 61 s after the last repeat: a new alert
	got := a.Recent()
	type row struct {
		Kind, Msg string
		Count     int
	}
	var rows []row
	for _, r := range got {
		rows = append(rows, row{r.Kind, r.Message, r.Count})
	}
	want := []row{{"memory-alert", "96%", 2}, {"sshd-gone", "gone", 1}, {"memory-alert", "97%", 1}}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("Recent() (-want +got):\n%s", diff)
	}
	if got[0].Workspace != "ws1" {
		t.Errorf("workspace = %q", got[0].Workspace)
	}
}

type hook struct {
	mu       sync.Mutex
	got      []Alert
	failures int // fail this many requests with 503 first
	status   int // if set, always answer this
}

func (h *hook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.status != 0 {
		w.WriteHeader(h.status)
		return
	}
	if h.failures > 0 {
		h.failures--
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	var a Alert
	if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	h.got = append(h.got, a)
}

func (h *hook) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.got)
}

func waitStats(t *testing.T, a *Aggregator, cond func(Stats) bool) Stats {
	t.Helper()
	var s Stats
	poll.Eventually(t, 5*time.Second, func() (bool, string) {
		s = a.Stats()
		return cond(s), fmt.Sprintf("stats never reached the expected state: %+v", s)
	})
	return s
}

func TestWebhookRetriesAndRateLimit(t *testing.T) {
	tests := []struct {
		name                          string
		hook                          *hook
		raise                         int
		wantDelivered, wantFailed     uint64
		wantRateLimited, wantReceived int
	}{
		{"retried until the webhook recovers", &hook{failures: 2}, 1, 1, 0, 0, 1},
		{"a 4xx is not retried", &hook{status: http.StatusBadRequest}, 1, 0, 1, 0, 0},
		{"5xx forever gives up after the attempts", &hook{status: http.StatusBadGateway}, 1, 0, 1, 0, 0},
		{"beyond the burst alerts are rate-limited", &hook{}, 8, 5, 0, 3, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.hook)
			defer srv.Close()
			c := &clock{time.Unix(1000, 0)}
			a := New(Config{WebhookURL: srv.URL, Burst: 5, RatePerMin: 1, Attempts: 3, Backoff: time.Millisecond}, c.now, srv.Client(), nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go a.Run(ctx)
			for i := 0; i < tt.raise; i++ {
				a.Raise("k", string(rune('a'+i)), Warning, "m", nil)
			}
			s := waitStats(t, a, func(s Stats) bool { return s.Delivered+s.Failed == tt.wantDelivered+tt.wantFailed })
			if s.Delivered != tt.wantDelivered || s.Failed != tt.wantFailed || s.RateLimited != uint64(tt.wantRateLimited) {
				t.Errorf("stats = %+v; want delivered %d failed %d rate-limited %d", s, tt.wantDelivered, tt.wantFailed, tt.wantRateLimited)
			}
			if n := tt.hook.count(); n != tt.wantReceived {
				t.Errorf("webhook received %d alerts; want %d", n, tt.wantReceived)
			}
			if len(a.Recent()) != tt.raise {
				t.Errorf("Recent() kept %d; every alert must stay visible in the API", len(a.Recent()))
			}
		})
	}
}

// A critical alert is delivered even when warnings used up the burst.
func TestCriticalAlertsAreNeverRateLimited(t *testing.T) {
	h := &hook{}
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := &clock{time.Unix(1000, 0)}
	a := New(Config{WebhookURL: srv.URL, Burst: 2, RatePerMin: 1, Attempts: 1}, c.now, srv.Client(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	for _, r := range []struct {
		kind string
		sev  Severity
	}{{"cpu-storm", Warning}, {"memory-high", Warning}, {"sshd-rt-unavailable", Warning}, {"memory-kill", Critical}, {"fork-bomb", Critical}} {
		a.Raise(r.kind, "", r.sev, "m", nil)
	}
	s := waitStats(t, a, func(s Stats) bool { return s.Delivered+s.Failed == 4 })
	if s.Delivered != 4 || s.RateLimited != 1 {
		t.Errorf("stats = %+v; want 4 delivered (two warnings, both critical alerts) and the third warning rate-limited", s)
	}
	if n := h.count(); n != 4 {
		t.Errorf("webhook received %d alerts; want 4", n)
	}
}

func TestRateLimitRefills(t *testing.T) {
	c := &clock{time.Unix(1000, 0)}
	a := New(Config{WebhookURL: "http://127.0.0.1:1", Burst: 1, RatePerMin: 60}, c.now, nil, nil)
	a.Raise("k", "1", Info, "m", nil)
	a.Raise("k", "2", Info, "m", nil)
	c.t = c.t.Add(time.Second)
	a.Raise("k", "3", Info, "m", nil)
	if s := a.Stats(); s.RateLimited != 1 {
		t.Errorf("rate-limited = %d; want 1 (one token refilled after a second)", s.RateLimited)
	}
}

func TestBound(t *testing.T) {
	tests := []struct {
		name string
		in   string
		max  int
		want string
	}{
		{"short text unchanged", "/usr/bin/python3", 64, "/usr/bin/python3"},
		{"exactly max unchanged", "abcdef", 6, "abcdef"},
		{"newline and terminal escape replaced", "evil\n\x1b[2Jname\x00", 64, "evil??[2Jname?"},
		{"invalid UTF-8 replaced", "a\xff\xfeb", 64, "a??b"},
		{"long text cut with the marker within max", strings.Repeat("x", 100), 20, strings.Repeat("x", 20-len(truncMarker)) + truncMarker},
		{"cut on a character boundary", "aé" + strings.Repeat("é", 20), len(truncMarker) + 2, "a" + truncMarker},
		{"max below the marker gives the marker", "abcdef", 3, truncMarker},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Bound(tt.in, tt.max)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Bound(%q, %d) (-want +got):\n%s", tt.in, tt.max, diff)
			}
			if !utf8.ValidString(got) {
				t.Errorf("Bound(%q, %d) = %q is not valid UTF-8", tt.in, tt.max, got)
			}
		})
	}
}

// What the user chose (a process name, a path) is bounded before any
// alert keeps it, on the first raise and on repeats alike.
func TestRaiseBoundsUserText(t *testing.T) {
	c := &clock{time.Unix(1000, 0)}
	cfg := Config{MaxText: 32, MaxFields: 3}
	huge := strings.Repeat("A", 1<<20)
	many := map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": huge}
	tests := []struct {
		name  string
		raise func(a *Aggregator)
		want  Alert
	}{
		{"huge subject, message and field value", func(a *Aggregator) {
			a.Raise("kill", huge, Warning, "killed "+huge, map[string]string{"exe": "/tmp/\n" + huge})
		}, Alert{Kind: "kill", Subject: Bound(huge, 32), Message: Bound("killed "+huge, 32),
			Fields: map[string]string{"exe": Bound("/tmp/?"+huge, 32)}}},
		{"too many fields: the first keys kept and the rest counted", func(a *Aggregator) {
			a.Raise("kill", "", Warning, "m", many)
		}, Alert{Kind: "kill", Message: "m", Fields: map[string]string{"a": "1", "b": "2", TruncatedFields: "3"}}},
		{"an aggregated repeat is bounded too", func(a *Aggregator) {
			a.Raise("kill", "s", Warning, "short", nil)
			a.Raise("kill", "s", Warning, huge, map[string]string{"pid": huge})
		}, Alert{Kind: "kill", Subject: "s", Message: Bound(huge, 32), Fields: map[string]string{"pid": Bound(huge, 32)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := New(cfg, c.now, nil, nil)
			tt.raise(a)
			got := a.Recent()
			if len(got) != 1 {
				t.Fatalf("%d alerts kept; want 1", len(got))
			}
			g := got[0]
			g.Severity, g.First, g.Last, g.Count = "", time.Time{}, time.Time{}, 0
			if diff := cmp.Diff(tt.want, g); diff != "" {
				t.Errorf("kept alert (-want +got):\n%s", diff)
			}
		})
	}
}

// The kept alerts are a ring of Keep, whether raised or restored from a
// state file, and restored ones are bounded like raised ones.
func TestKeptAlertsAreBounded(t *testing.T) {
	c := &clock{time.Unix(1000, 0)}
	a := New(Config{Keep: 3, MaxText: 16}, c.now, nil, nil)
	for i := range 5 {
		a.Raise("k"+strconv.Itoa(i), "", Info, "m", nil)
	}
	kinds := func() []string {
		var out []string
		for _, r := range a.Recent() {
			out = append(out, r.Kind)
		}
		return out
	}
	if diff := cmp.Diff([]string{"k2", "k3", "k4"}, kinds()); diff != "" {
		t.Errorf("raised beyond Keep (-want +got):\n%s", diff)
	}
	var saved []Alert
	for i := range 5 {
		saved = append(saved, Alert{Kind: "r" + strconv.Itoa(i), Message: strings.Repeat("\x1b", 100), Fields: map[string]string{"exe": strings.Repeat("p", 100)}})
	}
	a.Restore(saved)
	if diff := cmp.Diff([]string{"r2", "r3", "r4"}, kinds()); diff != "" {
		t.Errorf("restored beyond Keep (-want +got):\n%s", diff)
	}
	for _, r := range a.Recent() {
		if r.Message != Bound(strings.Repeat("?", 100), 16) || len(r.Fields["exe"]) > 16 {
			t.Errorf("restored alert not bounded: %+v", r)
		}
	}
}
