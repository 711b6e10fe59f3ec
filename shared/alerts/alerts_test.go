package alerts

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/access"
	"labkeep/shared/rate"
	"labkeep/shared/workspacekey"
)

func valid() Alert {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	return Alert{Posted: Posted{Kind: "memory-kill", Subject: "pid 42", Severity: Critical, Message: "killed python3 (3.9 GiB)",
		Fields: map[string]string{"pid": "42"}, Workspace: "ws", First: t0, Last: t0.Add(time.Second), Count: 2}}
}

func TestCheck(t *testing.T) {
	l := Limits{MaxText: 64, MaxFields: 2, PerSession: 10}
	tests := []struct {
		name   string
		change func(*Alert)
		want   string // "" for accepted, else a part of the error
	}{
		{"guardian's alert", func(*Alert) {}, ""},
		{"text at the bound", func(a *Alert) { a.Message = strings.Repeat("é", 32) }, ""},
		{"no kind", func(a *Alert) { a.Kind = "" }, `"kind" is required`},
		{"unknown severity", func(a *Alert) { a.Severity = "fatal" }, `"severity" must be`},
		{"message too long", func(a *Alert) { a.Message = strings.Repeat("x", 65) }, "message is 65 bytes, at most 64"},
		{"kind too long", func(a *Alert) { a.Kind = strings.Repeat("k", MaxKind+1) }, "kind is 65 bytes"},
		{"terminal escape in the subject", func(a *Alert) { a.Subject = "\x1b[2J" }, "subject holds a control character"},
		{"newline in a field", func(a *Alert) { a.Fields["pid"] = "4\n2" }, "field pid holds a control character"},
		{"invalid UTF-8 in the workspace", func(a *Alert) { a.Workspace = "\xff" }, "workspace is not valid UTF-8"},
		{"too many fields", func(a *Alert) { a.Fields["a"], a.Fields["b"] = "1", "2" }, "3 fields, at most 2"},
		{"long field name", func(a *Alert) { a.Fields[strings.Repeat("f", 65)] = "1" }, "field name is 65 bytes"},
		{"zero count", func(a *Alert) { a.Count = 0 }, `"count" must be at least 1`},
		{"no first", func(a *Alert) { a.First = time.Time{} }, `"first" is required`},
		{"last before first", func(a *Alert) { a.Last = a.First.Add(-time.Second) }, `"last" may not be before it`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := valid()
			tc.change(&a)
			err := l.Check(a)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Check = %v, want accepted", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}

// The webhook credential is the workspace key's Alert use (whose rules
// shared/workspacekey tests): never a cleanup token, and verified for its
// own session alone.
func TestTokenIsTheWorkspaceKeysAlertUse(t *testing.T) {
	k := Key{Secret: []byte("0123456789abcdef0123456789abcdef"), Env: "prod"}
	const a, b = "6f1c9f0e-8a51-4d7e-9a43-0e4f2b7c1d20", "0b7d2e11-3c4f-4a5b-8c6d-7e8f9a0b1c2d"
	wk := workspacekey.Key(k)
	got := []any{k.Token(a), k.Token(a) == wk.Token(workspacekey.Cleanup, a), k.Verify(a, k.Token(a)), k.Verify(b, k.Token(a))}
	want := []any{wk.Token(workspacekey.Alert, a), false, true, false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("token, is it the cleanup token, verified for its session, for another (-want +got):\n%s", diff)
	}
}

// TestWebhookURLCarriesBasicCredentials checks the URL holds the session
// and its token as user info (which Go's client, guardian's, sends as HTTP
// Basic credentials) and keeps the path, with nothing in the query.
func TestWebhookURLCarriesBasicCredentials(t *testing.T) {
	k := Key{Secret: []byte("0123456789abcdef0123456789abcdef"), Env: "prod"}
	const id = "6f1c9f0e-8a51-4d7e-9a43-0e4f2b7c1d20"
	req, err := http.NewRequest(http.MethodPost, k.WebhookURL("https://labkeep.example/guardianAlert", id), nil)
	if err != nil {
		t.Fatal(err)
	}
	pass, _ := req.URL.User.Password()
	if diff := cmp.Diff([]string{id, k.Token(id), "/guardianAlert", ""}, []string{req.URL.User.Username(), pass, req.URL.Path, req.URL.RawQuery}); diff != "" {
		t.Errorf("webhook URL (-want +got):\n%s", diff)
	}
}

func TestCheckWebhookURL(t *testing.T) {
	for url, ok := range map[string]bool{
		"https://labkeep.example/guardianAlert": true,
		"http://10.0.0.1:8080/guardianAlert":    true,
		"labkeep.example/guardianAlert":         false,
		"ftp://labkeep.example/x":               false,
		"https://u:p@labkeep.example/x":         false,
		"https://labkeep.example/x?token=1":     false,
	} {
		if err := CheckWebhookURL(url); (err == nil) != ok {
			t.Errorf("CheckWebhookURL(%q) = %v, want ok=%v", url, err, ok)
		}
	}
}

func TestAdmit(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	l := Limits{MaxText: 512, MaxFields: 16, PerSession: 200, PerWindow: 2, Window: time.Minute, AfterEnd: 5 * time.Minute}
	tests := []struct {
		name      string
		limits    Limits
		standing  Standing
		want      error         // nil: admitted
		wantRetry time.Duration // for ErrTooMany
	}{
		{"a live session under its rate", l, Standing{Recent: []time.Time{now.Add(-time.Second)}}, nil, 0},
		{"a live session at its rate: until the oldest leaves the window", l,
			Standing{Recent: []time.Time{now.Add(-time.Second), now.Add(-50 * time.Second)}}, ErrTooMany, 10 * time.Second},
		{"no rate", Limits{PerSession: 200, AfterEnd: time.Minute},
			Standing{Recent: []time.Time{now, now, now}}, nil, 0},
		{"ended within AfterEnd: the Pod's last alerts", l, Standing{Ended: now.Add(-5 * time.Minute)}, nil, 0},
		{"ended longer ago: the credentials expired", l, Standing{Ended: now.Add(-5*time.Minute - time.Second)}, ErrEnded, 0},
		{"ended and at its rate: expired first", l,
			Standing{Ended: now.Add(-time.Hour), Recent: []time.Time{now, now}}, ErrEnded, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.limits.Admit(tt.standing, now)
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Fatalf("Admit = %v, want %v", err, tt.want)
			}
			var ex *rate.Exceeded
			var retry time.Duration
			if errors.As(err, &ex) {
				retry = ex.RetryAfter
			}
			if diff := cmp.Diff(tt.wantRetry, retry); diff != "" {
				t.Errorf("retry after (-want +got):\n%s", diff)
			}
		})
	}
	if !errors.Is(ErrEnded, access.ErrUnauthorized) {
		t.Error("ErrEnded is no ErrUnauthorized: an expired credential must answer 401")
	}
}

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Limits)
		want   string // "" = valid
	}{
		{"the defaults", func(*Limits) {}, ""},
		{"no rate", func(l *Limits) { l.PerWindow, l.Window = 0, 0 }, ""},
		{"a rate without a window", func(l *Limits) { l.Window = 0 }, "Window: must be positive"},
		{"a rate above what a session keeps", func(l *Limits) { l.PerWindow = l.PerSession + 1 }, "PerWindow: 201 is more than the 200 alerts a session keeps"},
		{"a negative time after the end", func(l *Limits) { l.AfterEnd = -time.Second }, "AfterEnd: must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := DefaultLimits()
			tt.change(&l)
			err := l.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate = %v, want valid", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate = %v, want %q", err, tt.want)
			}
		})
	}
}
