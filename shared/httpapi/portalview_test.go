package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/session"
)

// The session JSON carries what the portal shows beside the countdown:
// the warnings (from lifetime.Warnings, due or not at serverTime), why
// Extend is refused, and each node's phase.
func TestViewWarningsRefusalAndPhases(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	open := lifetime.Policy{Lifetime: time.Hour, MaxLifetime: 3 * time.Hour}.Open(t0)
	atCap := lifetime.Window{StartedAt: t0, ExpiresAt: t0.Add(3 * time.Hour), MaxExpiresAt: t0.Add(3 * time.Hour)}
	warnings := func(w lifetime.Window, due10, due5 bool) []warningJSON {
		return []warningJSON{
			{BeforeSeconds: 600, At: w.ExpiresAt.Add(-10 * time.Minute), Due: due10},
			{BeforeSeconds: 300, At: w.ExpiresAt.Add(-5 * time.Minute), Due: due5},
		}
	}
	tests := []struct {
		name        string
		status      session.Status
		window      lifetime.Window
		at          time.Duration
		wantWarn    []warningJSON
		wantRefusal string
	}{
		{"running, an hour left", session.StatusRunning, open, 0, warnings(open, false, false), ""},
		{"running, 9 minutes left", session.StatusRunning, open, 51 * time.Minute, warnings(open, true, false), ""},
		{"running, 4 minutes left", session.StatusRunning, open, 56 * time.Minute, warnings(open, true, true), ""},
		{"running at the cap", session.StatusRunning, atCap, time.Hour, warnings(atCap, false, false), lifetime.ErrAtCap.Error()},
		{"provisioning", session.StatusProvisioning, open, 0, warnings(open, false, false), NotReadyToExtend},
		{"expired before the reaper", session.StatusRunning, open, time.Hour, warnings(open, false, false), lifetime.ErrExpired.Error()},
		{"closed: none", session.StatusClosed, open, time.Minute, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now := t0.Add(tc.at)
			a := &API{now: func() time.Time { return now }}
			v := a.view(session.Session{ID: "x", Status: tc.status, Window: tc.window}, access.Principal{Subject: "ann", Role: access.RoleStudent})
			if diff := cmp.Diff(tc.wantWarn, v.Warnings); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
			if v.ExtendRefusal != tc.wantRefusal {
				t.Errorf("extendRefusal = %q, want %q", v.ExtendRefusal, tc.wantRefusal)
			}
			if (v.ExtendRefusal == "") != v.Extendable && tc.status.Live() {
				t.Errorf("extendable %v with refusal %q", v.Extendable, v.ExtendRefusal)
			}
		})
	}
}

// A node's phase and, for one the cluster cannot place, the reason: the
// reason shows only in that phase (a stale one on a node that has an
// address or runs is not repeated).
func TestNodePhase(t *testing.T) {
	const why = "0/1 nodes are available: 1 Insufficient cpu."
	tests := []struct {
		name       string
		node       session.Node
		want       string
		wantReason string
	}{
		{"created, no address", session.Node{Name: "n"}, PhaseScheduled, ""},
		{"the cluster cannot place it", session.Node{Name: "n", Unschedulable: why}, PhaseUnschedulable, why},
		{"address, not ready", session.Node{Name: "n", SSHHost: "10.0.0.1"}, PhaseBooting, ""},
		{"placed after all", session.Node{Name: "n", SSHHost: "10.0.0.1", Unschedulable: why}, PhaseBooting, ""},
		{"ready", session.Node{Name: "n", SSHHost: "10.0.0.1", Ready: true}, PhaseReady, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := &API{now: time.Now}
			v := a.view(session.Session{ID: "x", Status: session.StatusProvisioning, Nodes: []session.Node{tc.node}}, access.Principal{Subject: "ann", Role: access.RoleStudent})
			got := v.Nodes[0]
			if diff := cmp.Diff([2]string{tc.want, tc.wantReason}, [2]string{got.Phase, got.PhaseReason}); diff != "" {
				t.Errorf("phase, reason (-want +got):\n%s", diff)
			}
		})
	}
}

// GET /labs lists the catalog for any signed-in caller, and refuses the
// unauthenticated and bad input without touching anything.
func TestLabsEndpoint(t *testing.T) {
	cat, err := labs.Parse([]byte(`
labs:
- name: shell
  description: a Debian shell
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  nodes: [{role: workspace}]
- name: k8s
  kind: vm
  disk: {containerDisk: quay.io/containerdisks/debian:12}
  nodes: [{role: control}, {role: worker, count: 2}]
`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	secret := []byte("portal-test-secret-0123456789abcdef")
	auth, err := access.DefaultTokenRules().Authenticator(secret, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	a := New(Options{Sessions: &session.Service{Labs: cat}, Auth: auth, Now: func() time.Time { return now }})
	tok, err := access.DefaultTokenRules().Issue(secret, "ann", access.RoleStudent, now)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, method, path, token string
		wantStatus                int
		wantBody                  string
	}{
		{"a student gets the labs by name", "GET", "/labs", tok, http.StatusOK,
			`{"labs":[{"name":"k8s","kind":"vm","nodes":3},{"name":"shell","description":"a Debian shell","kind":"pod","nodes":1}]}`},
		{"no token", "GET", "/labs", "", http.StatusUnauthorized, ""},
		{"a query parameter", "GET", "/labs?x=1", tok, http.StatusBadRequest, ""},
		{"POST", "POST", "/labs", tok, http.StatusMethodNotAllowed, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.path, nil)
			if tc.token != "" {
				r.Header.Set("Authorization", "Bearer "+tc.token)
			}
			w := httptest.NewRecorder()
			a.ServeHTTP(w, r)
			if w.Code != tc.wantStatus {
				t.Fatalf("%s %s = %d %s, want %d", tc.method, tc.path, w.Code, w.Body, tc.wantStatus)
			}
			if tc.wantBody == "" {
				return
			}
			var got, want any
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tc.wantBody), &want); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}
