package terminal

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"labkeep/shared/access"
	"labkeep/shared/httpapi"
	"labkeep/shared/termlimit"
)

// Requests refused before anything reaches the database or the cluster:
// the handler has neither (the Service and the cluster are unreachable
// here), so each answer is the refusal itself. The real refusals of
// another student's session are shown on the real stack (test/podlab).
func TestRefusedBeforeTheSession(t *testing.T) {
	secret := []byte("terminal-test-secret-0123456789abcdef")
	now := func() time.Time { return time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC) }
	auth := access.NewAuthenticator(secret, now)
	api := httpapi.New(httpapi.Options{Auth: auth, Now: now})
	h, err := New(Options{Auth: auth, API: api, Kube: &rest.Config{Host: "http://127.0.0.1:1"}, Namespace: "s", Now: now, Limits: termlimit.DefaultLimits(), Owners: objectOwners{}})
	if err != nil {
		t.Fatal(err)
	}
	token, err := access.DefaultTokenRules().Issue(secret, "tara", access.RoleStudent, now())
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		Status int
		Code   string
	}
	tests := []struct {
		name, method, path string
		header             http.Header
		body               string
		want               answer
	}{
		{"upgrade from another site's page", "GET", "/terminal/connect?session=x",
			http.Header{"Origin": {"https://evil.example"}, "Authorization": {"Bearer " + token}}, "", answer{403, "forbidden"}},
		{"upgrade with a malformed Origin", "GET", "/terminal/connect?session=x",
			http.Header{"Origin": {"null"}}, "", answer{403, "forbidden"}},
		{"upgrade with a bad token in the header", "GET", "/terminal/connect?session=x",
			http.Header{"Authorization": {"Bearer nope"}}, "", answer{401, "unauthorized"}},
		{"upgrade with a good token but no session id", "GET", "/terminal/connect",
			http.Header{"Authorization": {"Bearer " + token}}, "", answer{400, "bad_request"}},
		{"cleanup without a token", "POST", "/terminal/cleanup", nil, `{"session":"x"}`, answer{401, "unauthorized"}},
		{"cleanup that is not JSON", "POST", "/terminal/cleanup",
			http.Header{"Authorization": {"Bearer " + token}, "Content-Type": {"text/plain"}}, `session=x`, answer{415, "unsupported_media_type"}},
		{"cleanup with an unknown field", "POST", "/terminal/cleanup",
			http.Header{"Authorization": {"Bearer " + token}, "Content-Type": {"application/json"}}, `{"session":"x","all":true}`, answer{400, "bad_request"}},
		{"cleanup without a session id", "POST", "/terminal/cleanup",
			http.Header{"Authorization": {"Bearer " + token}, "Content-Type": {"application/json"}}, `{}`, answer{400, "bad_request"}},
		{"cleanup by GET", "GET", "/terminal/cleanup", nil, "", answer{404, "not_found"}},
		{"no such endpoint", "GET", "/terminal/vnc", nil, "", answer{404, "not_found"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, "http://labkeep.example"+tc.path, strings.NewReader(tc.body))
			for k, v := range tc.header {
				r.Header[k] = v
			}
			w := httptest.NewRecorder()
			h.Mount(http.NotFoundHandler()).ServeHTTP(w, r)
			var body struct {
				Error struct{ Code string } `json:"error"`
			}
			_ = json.Unmarshal(w.Body.Bytes(), &body)
			if diff := cmp.Diff(tc.want, answer{w.Code, body.Error.Code}); diff != "" {
				t.Errorf("(-want +got):\n%s\nbody: %s", diff, w.Body)
			}
		})
	}
}

// The terminal page is served under its own policy: the portal's, with
// inline styles for xterm.js and nothing else relaxed.
func TestPagePolicy(t *testing.T) {
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(PageSecurityPolicy, want) {
			t.Errorf("policy lacks %q: %s", want, PageSecurityPolicy)
		}
	}
	if strings.Count(PageSecurityPolicy, "unsafe-") != 1 || !strings.Contains(PageSecurityPolicy, "style-src 'self' 'unsafe-inline'") {
		t.Errorf("policy relaxes more than inline styles: %s", PageSecurityPolicy)
	}
	if strings.Contains(string(page), "<script>") || strings.Contains(string(page), " style=") {
		t.Error("the page itself has inline script or style")
	}
}

// Only the latest size waiting matters, and closing ends the resizes.
func TestSizeQueue(t *testing.T) {
	q := newSizeQueue()
	q.push(remotecommand.TerminalSize{Width: 80, Height: 24})
	q.push(remotecommand.TerminalSize{Width: 120, Height: 40})
	if got := q.Next(); got == nil || *got != (remotecommand.TerminalSize{Width: 120, Height: 40}) {
		t.Errorf("Next = %v, want the latest size 120x40", got)
	}
	q.close()
	if got := q.Next(); got != nil {
		t.Errorf("Next after close = %v, want nil", got)
	}
}
