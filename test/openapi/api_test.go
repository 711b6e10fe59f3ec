package openapi_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/ssh"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"labkeep/infra"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
	"labkeep/shared/reap"
)

// notExercised are the documented answers the drive below does not
// produce, each with the reason; every other documented operation and
// status must be seen at least once.
var notExercised = map[string]string{
	"POST /terminal/cleanup 502": "guardian refusing the call or something else answering in its place: each workspace's " +
		"guardian holds its own session's token, which labkeep alone derives, so no operator step makes a live guardian " +
		"refuse it; test/podlab/cleanup_token_test.go drives it on the real node (a program in guardian's place answering " +
		"a redirect) and shared/terminal's tests read every answer guardian's description gives",
	"GET /terminal/connect 429": "refused only past a cap: a student's terminals held open (live exec streams into a " +
		"running workspace Pod) while the call is made; test/podlab/terminal_limits_test.go drives it on the real node and " +
		"shared/terminal's tests check the answer's status, code and Retry-After",
}

// bearer is an Authorization header carrying token.
func bearer(token string) string { return "Bearer " + token }

// basicAuth is an HTTP Basic Authorization header.
func basicAuth(user, pass string) string {
	r := http.Request{Header: http.Header{}}
	r.SetBasicAuth(user, pass)
	return r.Header.Get("Authorization")
}

// wsUpgrade are the headers of a WebSocket upgrade (RFC 6455).
var wsUpgrade = map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}

// refuseDatabase makes d's PostgreSQL database refuse connections and
// ends the ones open, as a database going away does, until the test ends.
func refuseDatabase(t *testing.T, d *stacktest.Deployment) {
	t.Helper()
	u, err := url.Parse(d.App.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	db := pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()
	server, err := pgxpool.New(t.Context(), st.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(server.Close)
	for _, q := range []string{
		"ALTER DATABASE " + db + " WITH ALLOW_CONNECTIONS false",
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '" + strings.TrimPrefix(u.Path, "/") + "'",
	} {
		if _, err := server.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		if _, err := server.Exec(context.Background(), "ALTER DATABASE "+db+" WITH ALLOW_CONNECTIONS true"); err != nil {
			t.Errorf("letting connections in again: %v", err)
		}
	})
}

// padded is a JSON object of fields grown past the 64 KiB body bound with
// white space, so it still matches the description: only its size is
// wrong.
func padded(fields string) string { return "{" + fields + strings.Repeat(" ", 65<<10) + "}" }

// alertJSON is an alert as guardian posts it.
func alertJSON(kind, message string) string {
	return fmt.Sprintf(`{"kind":%q,"subject":"pid 4242","severity":"critical","message":%q,"fields":{"pid":"4242"},`+
		`"workspace":"ws-1","first":"2026-12-01T10:00:00Z","last":"2026-12-01T10:00:03Z","count":2}`, kind, message)
}

// Every route of the functions, driven through its success and its error
// answers against the real handlers on the real stack; the checker
// validates every request and answer against the description. Then every
// documented operation and status must have been seen, or be in
// notExercised.
func TestEveryRouteMatchesTheDescription(t *testing.T) {
	doc := loadDescription(t)
	chk := newChecker(t, doc)
	// Three VMs: a, the stuck student's and b's; c finds none. A session
	// may be extended by at most a minute, so a minute on the clock
	// reaches the cap.
	// The shipped labs, and one keeping a home.
	sample, err := infra.File("labs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	labsYAML := string(sample) + `  - name: shell-home
    kind: pod
    image: ghcr.io/labkeep/workspace:debian12
    nodes: [{role: workspace, cpu: 500m, memory: 512Mi}]
    home: {size: 64Mi, mountPath: /home/student}
  - name: shell-home-unpulled
    kind: pod
    image: ghcr.io/labkeep/workspace:never-imported
    nodes: [{role: workspace, cpu: 500m, memory: 512Mi}]
    home: {size: 64Mi, mountPath: /home/student}
`
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 3, Lifetime: 10 * time.Minute, MaxLifetime: 11 * time.Minute, LabsYAML: labsYAML})
	cl := newClient(d.Server.URL, chk)
	tok := func(sub string) string { return bearer(d.Token(sub, "student")) }
	admin := bearer(d.Token("ops", "admin"))
	scheduler := bearer(stacktest.SchedulerToken)
	id := func(a answer) string {
		var s struct{ ID string }
		if err := json.Unmarshal(a.Body, &s); err != nil || s.ID == "" {
			t.Fatalf("no session id in %s", a.Body)
		}
		return s.ID
	}

	t.Run("service", func(t *testing.T) {
		cl.run(t, []call{
			{name: "healthz", method: "GET", path: "/healthz", status: 200},
			{name: "metrics", method: "GET", path: "/metrics", auth: bearer(stacktest.MetricsToken), status: 200},
			{name: "metrics without the metrics token", method: "GET", path: "/metrics", status: 401, code: "unauthorized", invalid: true},
			{name: "metrics with the scheduler's token", method: "GET", path: "/metrics", auth: scheduler, status: 401, code: "unauthorized"},
			{name: "the description", method: "GET", path: "/openapi.yaml", status: 200},
			{name: "an unknown path", method: "GET", path: "/nope", auth: tok("s"), status: 404, code: "not_found"},
			{name: "another method", method: "PUT", path: "/openSession", auth: tok("s"), body: `{"lab":"linux-vm"}`, status: 405, code: "method_not_allowed"},
			{name: "another method on an admin path", method: "POST", path: "/adminSessions", auth: admin, status: 405, code: "method_not_allowed"},
			{name: "another method on a reaper path", method: "GET", path: "/reapTick", auth: scheduler, status: 405, code: "method_not_allowed"},
			{name: "another method on a terminal path", method: "POST", path: "/terminal/connect", auth: tok("s"), status: 404, code: "not_found"},
			{name: "labs", method: "GET", path: "/labs", auth: tok("s"), status: 200},
			{name: "labs with a query", method: "GET", path: "/labs?x=1", auth: tok("s"), status: 400, code: "bad_request"},
			{name: "labs without a token", method: "GET", path: "/labs", status: 401, code: "unauthorized", invalid: true},
			{name: "labs with a forged token", method: "GET", path: "/labs", auth: bearer("forged"), status: 401, code: "unauthorized"},
		})
	})

	var a, b, p, q answer
	opened := t.Run("openSession", func(t *testing.T) {
		cl.run(t, []call{
			{name: "no token", method: "POST", path: "/openSession", body: `{"lab":"linux-vm"}`, status: 401, code: "unauthorized", invalid: true},
			{name: "not JSON", method: "POST", path: "/openSession", auth: tok("a"), ctype: "text/plain", body: `lab=linux-vm`, status: 415, code: "unsupported_media_type", invalid: true},
			{name: "no lab", method: "POST", path: "/openSession", auth: tok("a"), body: `{}`, status: 400, code: "bad_request", invalid: true},
			{name: "an unknown field", method: "POST", path: "/openSession", auth: tok("a"), body: `{"lab":"linux-vm","pool":"x"}`, status: 400, code: "bad_request", invalid: true},
			{name: "an unknown lab", method: "POST", path: "/openSession", auth: tok("a"), body: `{"lab":"nope"}`, status: 400, code: "unknown_lab"},
			{name: "a bad public key", method: "POST", path: "/openSession", auth: tok("a"), body: `{"lab":"linux-vm","publicKey":"not a key"}`, status: 400, code: "invalid_public_key"},
			{name: "for another student", method: "POST", path: "/openSession", auth: tok("a"), body: `{"lab":"linux-vm","student":"b"}`, status: 403, code: "forbidden"},
			{name: "too large", method: "POST", path: "/openSession", auth: tok("a"), body: padded(`"lab":"linux-vm"`), status: 413, code: "too_large"},
		})
		a = cl.do(t, call{method: "POST", path: "/openSession", auth: tok("a"), body: `{"lab":"linux-vm"}`, status: 201})
		cl.do(t, call{method: "POST", path: "/openSession", auth: tok("a"), body: `{"lab":"linux-vm"}`, status: 409, code: "session_exists"})
		p = cl.do(t, call{method: "POST", path: "/openSession", auth: tok(stuck), body: `{"lab":"linux-vm","publicKey":"` + publicKey(t) + `"}`, status: 201})
		b = cl.do(t, call{method: "POST", path: "/openSession", auth: admin, body: `{"lab":"linux-vm","student":"b","wait":true}`, status: 201})
		full := cl.do(t, call{method: "POST", path: "/openSession", auth: tok("c"), body: `{"lab":"linux-vm"}`, status: 503, code: "no_capacity"})
		if full.Header.Get("Retry-After") == "" {
			t.Errorf("503 no_capacity without Retry-After")
		}
		// Past the open rate: every refusal so far left a row; the next
		// open writes nothing and says when to retry.
		for range d.App.Config.OpenRate.Max {
			cl.do(t, call{method: "POST", path: "/openSession", auth: tok("looper"), body: `{"lab":"linux-vm"}`, status: 503, code: "no_capacity"})
		}
		limited := cl.do(t, call{method: "POST", path: "/openSession", auth: tok("looper"), body: `{"lab":"linux-vm"}`, status: 429, code: "too_many_opens"})
		if limited.Header.Get("Retry-After") == "" {
			t.Errorf("429 too_many_opens without Retry-After")
		}
		q = cl.do(t, call{method: "POST", path: "/openSession", auth: tok("c"), body: `{"lab":"linux-vm","wait":true}`, status: 202})
	})
	if !opened {
		t.FailNow()
	}
	aID, bID, pID, qID := id(a), id(b), id(p), id(q)
	d.WaitRunning("a", time.Minute)

	t.Run("getSession", func(t *testing.T) {
		cl.run(t, []call{
			{name: "own", method: "GET", path: "/getSession", auth: tok("a"), status: 200},
			{name: "by id", method: "GET", path: "/getSession?id=" + aID, auth: tok("a"), status: 200},
			{name: "queued", method: "GET", path: "/getSession", auth: tok("c"), status: 200},
			// While c still waits (later subtests move the clock past the
			// line's idle time): a terminal opens only once running.
			{name: "the terminal of a session waiting in line", method: "GET", path: "/terminal/connect?session=" + qID, auth: tok("c"), header: wsUpgrade, status: 409, code: "not_running"},
			{name: "as an admin", method: "GET", path: "/getSession?student=b", auth: admin, status: 200},
			{name: "an unknown parameter", method: "GET", path: "/getSession?pool=x", auth: tok("a"), status: 400, code: "bad_request"},
			{name: "no token", method: "GET", path: "/getSession", status: 401, code: "unauthorized", invalid: true},
			{name: "another student's", method: "GET", path: "/getSession?student=b", auth: tok("a"), status: 403, code: "forbidden"},
			{name: "none", method: "GET", path: "/getSession", auth: tok("nobody"), status: 404, code: "no_session"},
		})
	})

	t.Run("extendSession", func(t *testing.T) {
		cl.run(t, []call{
			{name: "no token", method: "POST", path: "/extendSession", status: 401, code: "unauthorized", invalid: true},
			{name: "not JSON", method: "POST", path: "/extendSession", auth: tok("a"), ctype: "text/plain", body: "x", status: 415, code: "unsupported_media_type", invalid: true},
			{name: "an unknown field", method: "POST", path: "/extendSession", auth: tok("a"), body: `{"minutes":30}`, status: 400, code: "bad_request", invalid: true},
			{name: "too large", method: "POST", path: "/extendSession", auth: tok("a"), body: padded(`"id":"` + aID + `"`), status: 413, code: "too_large"},
			{name: "for another student", method: "POST", path: "/extendSession", auth: tok("a"), body: `{"student":"b"}`, status: 403, code: "forbidden"},
			{name: "none", method: "POST", path: "/extendSession", auth: tok("nobody"), status: 404, code: "no_session"},
			{name: "provisioning", method: "POST", path: "/extendSession", auth: tok(stuck), status: 409, code: "not_running"},
		})
		// Extensions, a minute apart, until the maximum lifetime refuses
		// the next.
		for i := 0; ; i++ {
			if i == 5 {
				t.Fatal("5 extensions a minute apart and never extension_cap")
			}
			r := cl.do(t, call{method: "POST", path: "/extendSession", auth: tok("a"), body: `{"id":"` + aID + `"}`, status: nextExtend(t, cl, tok("a"))})
			if r.Status == http.StatusConflict {
				break
			}
			d.Clock.Advance(time.Minute)
		}
	})

	t.Run("terminal", func(t *testing.T) {
		ws := wsUpgrade
		with := func(h map[string]string) map[string]string {
			out := map[string]string{}
			for k, v := range ws {
				out[k] = v
			}
			for k, v := range h {
				out[k] = v
			}
			return out
		}
		cl.run(t, []call{
			{name: "upgraded, the token to come in the first message", method: "GET", path: "/terminal/connect?session=" + aID, header: ws, status: 101},
			{name: "a foreign Origin", method: "GET", path: "/terminal/connect?session=" + aID, header: with(map[string]string{"Origin": "https://elsewhere.example"}), status: 403, code: "forbidden"},
			{name: "no session", method: "GET", path: "/terminal/connect", auth: tok("a"), header: ws, status: 400, code: "bad_request", invalid: true},
			{name: "a forged token", method: "GET", path: "/terminal/connect?session=" + aID, auth: bearer("forged"), header: ws, status: 401, code: "unauthorized"},
			{name: "another student's session", method: "GET", path: "/terminal/connect?session=" + bID, auth: tok("a"), header: ws, status: 403, code: "forbidden"},
			{name: "a provisioning session", method: "GET", path: "/terminal/connect?session=" + pID, auth: tok(stuck), header: ws, status: 409, code: "not_running"},
			{name: "cleanup without a token", method: "POST", path: "/terminal/cleanup", body: `{"session":"` + aID + `"}`, status: 401, code: "unauthorized", invalid: true},
			{name: "cleanup not JSON", method: "POST", path: "/terminal/cleanup", auth: tok("a"), ctype: "text/plain", body: aID, status: 415, code: "unsupported_media_type", invalid: true},
			{name: "cleanup without a session", method: "POST", path: "/terminal/cleanup", auth: tok("a"), body: `{}`, status: 400, code: "bad_request", invalid: true},
			{name: "cleanup of a VM lab", method: "POST", path: "/terminal/cleanup", auth: tok("a"), body: `{"session":"` + aID + `"}`, status: 400, code: "bad_request"},
			{name: "cleanup of another student's session", method: "POST", path: "/terminal/cleanup", auth: tok("a"), body: `{"session":"` + bID + `"}`, status: 403, code: "forbidden"},
			{name: "cleanup of a provisioning session", method: "POST", path: "/terminal/cleanup", auth: tok(stuck), body: `{"session":"` + pID + `"}`, status: 409, code: "not_running"},
		})
	})

	t.Run("guardianAlert", func(t *testing.T) {
		key, basic := d.App.Config.AlertKey(), basicAuth
		own := basic(aID, key.Token(aID))
		none := "00000000-0000-4000-8000-000000000000"
		cl.run(t, []call{
			{name: "stored", method: "POST", path: "/guardianAlert", auth: own, body: alertJSON("memory-kill", "killed python3"), status: 201},
			{name: "another session's token", method: "POST", path: "/guardianAlert", auth: basic(aID, key.Token(bID)), body: alertJSON("k", "m"), status: 401, code: "unauthorized"},
			{name: "no credentials", method: "POST", path: "/guardianAlert", body: alertJSON("k", "m"), status: 401, code: "unauthorized", invalid: true},
			{name: "no such session", method: "POST", path: "/guardianAlert", auth: basic(none, key.Token(none)), body: alertJSON("k", "m"), status: 404, code: "no_session"},
			{name: "not JSON", method: "POST", path: "/guardianAlert", auth: own, ctype: "text/plain", body: "k", status: 415, code: "unsupported_media_type", invalid: true},
			{name: "a session in the body", method: "POST", path: "/guardianAlert", auth: own, body: `{"session":"` + bID + `","kind":"k"}`, status: 400, code: "bad_request", invalid: true},
			{name: "an unknown severity", method: "POST", path: "/guardianAlert", auth: own, body: strings.Replace(alertJSON("k", "m"), "critical", "fatal", 1), status: 400, code: "invalid_alert", invalid: true},
			{name: "no kind", method: "POST", path: "/guardianAlert", auth: own, body: alertJSON("", "m"), status: 400, code: "invalid_alert"},
			{name: "too large", method: "POST", path: "/guardianAlert", auth: own, body: alertJSON("k", strings.Repeat("x", 70<<10)), status: 413, code: "too_large"},
		})
		// Past the session's alert rate (one stored above): the next is
		// refused, nothing stored, and says when to retry.
		for range d.App.Config.Alerts.PerWindow - 1 {
			cl.do(t, call{method: "POST", path: "/guardianAlert", auth: own, body: alertJSON("k", "m"), status: 201})
		}
		limited := cl.do(t, call{method: "POST", path: "/guardianAlert", auth: own, body: alertJSON("k", "m"), status: 429, code: "too_many_alerts"})
		if limited.Header.Get("Retry-After") == "" {
			t.Errorf("429 too_many_alerts without Retry-After")
		}
	})

	t.Run("admin", func(t *testing.T) {
		cl.run(t, []call{
			{name: "sessions", method: "GET", path: "/adminSessions", auth: admin, status: 200},
			{name: "sessions with a query", method: "GET", path: "/adminSessions?student=a", auth: admin, status: 400, code: "bad_request"},
			{name: "sessions without a token", method: "GET", path: "/adminSessions", status: 401, code: "unauthorized", invalid: true},
			{name: "sessions as a student", method: "GET", path: "/adminSessions", auth: tok("a"), status: 403, code: "forbidden"},
			{name: "alerts", method: "GET", path: "/adminAlerts", auth: admin, status: 200},
			{name: "one session's alerts", method: "GET", path: "/adminAlerts?session=" + aID + "&limit=10", auth: admin, status: 200},
			{name: "alerts beyond the limit", method: "GET", path: "/adminAlerts?limit=501", auth: admin, status: 400, code: "bad_request", invalid: true},
			{name: "alerts of no session id", method: "GET", path: "/adminAlerts?session=x", auth: admin, status: 400, code: "bad_request", invalid: true},
			{name: "alerts without a token", method: "GET", path: "/adminAlerts", status: 401, code: "unauthorized", invalid: true},
			{name: "alerts as a student", method: "GET", path: "/adminAlerts", auth: tok("a"), status: 403, code: "forbidden"},
			{name: "status", method: "GET", path: "/adminStatus", auth: admin, status: 200},
			{name: "status without a token", method: "GET", path: "/adminStatus", status: 401, code: "unauthorized", invalid: true},
			{name: "status as a student", method: "GET", path: "/adminStatus", auth: tok("a"), status: 403, code: "forbidden"},
		})
	})

	t.Run("reaper", func(t *testing.T) {
		// A session whose deletes fail makes a run with failures; then
		// its close fails too (500), and the reaper reports it.
		d.Faults.FailDeletesOf(bID)
		cl.run(t, []call{
			{name: "a close whose deletes fail", method: "POST", path: "/closeSession", auth: tok("b"), status: 500, code: "internal"},
			{name: "reap now", method: "POST", path: "/adminReapNow", auth: admin, status: 200},
			{name: "reap now, a dry run", method: "POST", path: "/adminReapNow", auth: admin, body: `{"dryRun":true}`, status: 200},
			{name: "reap now, a bad body", method: "POST", path: "/adminReapNow", auth: admin, body: `{"dryRun":"yes"}`, status: 400, code: "bad_request", invalid: true},
			{name: "reap now, not JSON", method: "POST", path: "/adminReapNow", auth: admin, ctype: "text/plain", body: "dry", status: 415, code: "unsupported_media_type", invalid: true},
			{name: "reap now, too large", method: "POST", path: "/adminReapNow", auth: admin, body: padded(`"dryRun":true`), status: 413, code: "too_large"},
			{name: "reap now without a token", method: "POST", path: "/adminReapNow", status: 401, code: "unauthorized", invalid: true},
			{name: "reap now as a student", method: "POST", path: "/adminReapNow", auth: tok("a"), status: 403, code: "forbidden"},
			{name: "tick", method: "POST", path: "/reapTick", auth: scheduler, status: 200},
			{name: "tick with a CloudEvent", method: "POST", path: "/reapTick", auth: scheduler, body: `{"specversion":"1.0","type":"dev.knative.sources.ping"}`, status: 200},
			{name: "tick without the token", method: "POST", path: "/reapTick", status: 401, code: "unauthorized", invalid: true},
			{name: "tick with another token", method: "POST", path: "/reapTick", auth: bearer("forged"), status: 401, code: "unauthorized"},
			{name: "status after failing runs", method: "GET", path: "/adminStatus", auth: admin, status: 200},
		})
		d.Faults.Heal()
		// Another run holds the reaper lock: the scheduler's run is
		// skipped (200), the admin's refused (409 busy).
		unlock, ok, err := d.App.Store.TryLock(t.Context(), reap.LockName)
		if err != nil || !ok {
			t.Fatalf("taking the reaper lock = %v, %v", ok, err)
		}
		cl.run(t, []call{
			{name: "tick while another run reaps", method: "POST", path: "/reapTick", auth: scheduler, status: 200},
			{name: "reap now while another run reaps", method: "POST", path: "/adminReapNow", auth: admin, status: 409, code: "busy"},
		})
		unlock()
	})

	t.Run("closeSession", func(t *testing.T) {
		cl.run(t, []call{
			{name: "no token", method: "POST", path: "/closeSession", status: 401, code: "unauthorized", invalid: true},
			{name: "not JSON", method: "POST", path: "/closeSession", auth: tok("a"), ctype: "text/plain", body: "x", status: 415, code: "unsupported_media_type", invalid: true},
			{name: "an unknown field", method: "POST", path: "/closeSession", auth: tok("a"), body: `{"reason":"done"}`, status: 400, code: "bad_request", invalid: true},
			{name: "too large", method: "POST", path: "/closeSession", auth: tok("a"), body: padded(`"id":"` + aID + `"`), status: 413, code: "too_large"},
			{name: "for another student", method: "POST", path: "/closeSession", auth: tok("a"), body: `{"student":"b"}`, status: 403, code: "forbidden"},
			{name: "own", method: "POST", path: "/closeSession", auth: tok("a"), body: `{"id":"` + aID + `"}`, status: 200},
			{name: "again", method: "POST", path: "/closeSession", auth: tok("a"), status: 404, code: "no_session"},
			{name: "by an admin", method: "POST", path: "/closeSession", auth: admin, body: `{"student":"b"}`, status: 200},
			{name: "ended, by id", method: "GET", path: "/getSession?id=" + aID, auth: tok("a"), status: 200},
			{name: "provisioning", method: "POST", path: "/closeSession", auth: tok(stuck), status: 200},
		})
	})

	// Runs with work to report: one expired session reaped, another
	// whose deletes fail, so the reports carry items and failures and
	// adminStatus a failing session.
	t.Run("reaper with work", func(t *testing.T) {
		done := cl.do(t, call{method: "POST", path: "/openSession", auth: tok("r1"), body: `{"lab":"linux-vm"}`, status: 201})
		failing := cl.do(t, call{method: "POST", path: "/openSession", auth: tok("r2"), body: `{"lab":"linux-vm"}`, status: 201})
		d.WaitRunning("r1", time.Minute)
		d.WaitRunning("r2", time.Minute)
		d.Faults.FailDeletesOf(id(failing))
		defer d.Faults.Heal()
		d.Clock.Advance(12 * time.Minute)
		cl.run(t, []call{
			{name: "expired", method: "GET", path: "/getSession?id=" + id(done), auth: tok("r1"), status: 200},
			{name: "as the admins list it, expired", method: "GET", path: "/adminSessions", auth: admin, status: 200},
			{name: "a dry run with work", method: "POST", path: "/adminReapNow", auth: admin, body: `{"dryRun":true}`, status: 200},
			{name: "a tick with work", method: "POST", path: "/reapTick", auth: scheduler, status: 200},
			{name: "a run with a failure", method: "POST", path: "/adminReapNow", auth: admin, status: 200},
			{name: "status with a failing session", method: "GET", path: "/adminStatus", auth: admin, status: 200},
			{name: "reaped, as its student reads it", method: "GET", path: "/getSession?id=" + id(done), auth: tok("r1"), status: 200},
			{name: "reaped, as an admin reads it", method: "GET", path: "/getSession?student=r1&id=" + id(done), auth: admin, status: 200},
		})
		type run struct{ Items, Failures []json.RawMessage }
		var status struct {
			RecentRuns      []run
			FailingSessions []json.RawMessage
		}
		r := cl.do(t, call{method: "GET", path: "/adminStatus", auth: admin, status: 200})
		worked := func(r run) bool { return len(r.Items) > 0 && len(r.Failures) > 0 }
		if err := json.Unmarshal(r.Body, &status); err != nil || len(status.FailingSessions) == 0 || !slices.ContainsFunc(status.RecentRuns, worked) {
			t.Errorf("adminStatus shows no run with both items and failures, or no failing session, so their schemas went unchecked: %s", r.Body)
		}
	})

	// A Pod lab on the real node: guardian's cleanup report, its session's
	// own token verified by its own guardian.
	t.Run("cleanup on the real node", func(t *testing.T) {
		w := cl.do(t, call{method: "POST", path: "/openSession", auth: tok("w"), body: `{"lab":"shell"}`, status: 201})
		d.WaitRunning("w", 3*time.Minute)
		body := `{"session":"` + id(w) + `"}`
		cl.do(t, call{name: "cleanup", method: "POST", path: "/terminal/cleanup", auth: tok("w"), body: body, status: 200})
		cl.do(t, call{method: "POST", path: "/closeSession", auth: tok("w"), status: 200})
	})

	// Students' homes on the real node: h's is archived while its lab runs
	// and while none does and, once unused, deleted; q's is held by a lab
	// whose workspace never starts (its image is nowhere); k's stays for
	// the database-down answers below.
	homeOf := func(student string) string { return kube.HomeName(d.Env, student, "") }
	t.Run("homes", func(t *testing.T) {
		for _, s := range []string{"h", "k"} {
			cl.do(t, call{method: "POST", path: "/openSession", auth: tok(s), body: `{"lab":"shell-home"}`, status: 201})
			d.WaitRunning(s, 3*time.Minute)
		}
		h, named := homeOf("h"), func(h string) string { return `{"name":"` + h + `"}` }
		cl.run(t, []call{
			{name: "homes", method: "GET", path: "/homes", auth: tok("h"), status: 200},
			{name: "every home", method: "GET", path: "/homes?all=true", auth: admin, status: 200},
			{name: "homes with an unknown query", method: "GET", path: "/homes?x=1", auth: tok("h"), status: 400, code: "bad_request"},
			{name: "homes without a token", method: "GET", path: "/homes", status: 401, code: "unauthorized", invalid: true},
			{name: "every home as a student", method: "GET", path: "/homes?all=true", auth: tok("h"), status: 403, code: "forbidden"},
			{name: "archive", method: "GET", path: "/homeArchive?name=" + h, auth: tok("h"), status: 200},
			{name: "archive without a name", method: "GET", path: "/homeArchive", auth: tok("h"), status: 400, code: "bad_request", invalid: true},
			{name: "archive without a token", method: "GET", path: "/homeArchive?name=" + h, status: 401, code: "unauthorized", invalid: true},
			{name: "archive of another's home", method: "GET", path: "/homeArchive?name=" + h, auth: tok("k"), status: 403, code: "forbidden"},
			{name: "delete a home in use", method: "POST", path: "/adminDeleteHome", auth: admin, body: named(h), status: 409, code: "home_in_use"},
			{name: "delete no home", method: "POST", path: "/adminDeleteHome", auth: admin, body: named("home-nope"), status: 404, code: "no_home"},
			{name: "delete without a name", method: "POST", path: "/adminDeleteHome", auth: admin, body: `{}`, status: 400, code: "bad_request", invalid: true},
			{name: "delete, not JSON", method: "POST", path: "/adminDeleteHome", auth: admin, ctype: "text/plain", body: h, status: 415, code: "unsupported_media_type", invalid: true},
			{name: "delete, too large", method: "POST", path: "/adminDeleteHome", auth: admin, body: padded(`"name":"` + h + `"`), status: 413, code: "too_large"},
			{name: "delete without a token", method: "POST", path: "/adminDeleteHome", body: named(h), status: 401, code: "unauthorized", invalid: true},
			{name: "delete as a student", method: "POST", path: "/adminDeleteHome", auth: tok("h"), body: named(h), status: 403, code: "forbidden"},
			{name: "close h", method: "POST", path: "/closeSession", auth: tok("h"), status: 200},
			{name: "close k", method: "POST", path: "/closeSession", auth: tok("k"), status: 200},
			{name: "archive with no session holding it", method: "GET", path: "/homeArchive?name=" + h, auth: tok("h"), status: 200},
			{name: "open a lab whose image the node never gets", method: "POST", path: "/openSession", auth: tok("q"), body: `{"lab":"shell-home-unpulled"}`, status: 201},
			{name: "archive while the session holding it starts", method: "GET", path: "/homeArchive?name=" + homeOf("q"), auth: tok("q"), status: 409, code: "not_running"},
			{name: "close q", method: "POST", path: "/closeSession", auth: tok("q"), status: 200},
			{name: "delete the unused home", method: "POST", path: "/adminDeleteHome", auth: admin, body: named(h), status: 200},
		})

		// A deployment whose home reader's image is nowhere: the reader
		// never starts, and the download says so.
		bad := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: labsYAML, HomeReaderImage: "ghcr.io/labkeep/workspace:never-imported"})
		badCl := newClient(bad.Server.URL, chk)
		badCl.do(t, call{method: "POST", path: "/openSession", auth: bearer(bad.Token("r", "student")), body: `{"lab":"shell-home"}`, status: 201})
		bad.WaitRunning("r", 3*time.Minute)
		badCl.do(t, call{method: "POST", path: "/closeSession", auth: bearer(bad.Token("r", "student")), status: 200})
		badCl.do(t, call{name: "archive whose reader never starts", method: "GET", path: "/homeArchive?name=" + kube.HomeName(bad.Env, "r", ""),
			auth: bearer(bad.Token("r", "student")), status: 502, code: "bad_gateway"})
	})

	// Reservations: booked, overbooked, listed, cancelled, and each
	// refusal of a bad one.
	t.Run("reservations", func(t *testing.T) {
		start := d.Clock.Now().Add(time.Hour).UTC()
		window := func(seats int, course string) string {
			return fmt.Sprintf(`{"course":%q,"lab":"linux-vm","seats":%d,"start":%q,"end":%q}`,
				course, seats, start.Format(time.RFC3339), start.Add(time.Hour).Format(time.RFC3339))
		}
		booked := cl.do(t, call{name: "reserve", method: "POST", path: "/adminReserve", auth: admin, body: window(1, "cs-101"), status: 201})
		var got struct{ Reservation struct{ ID int64 } }
		if err := json.Unmarshal(booked.Body, &got); err != nil || got.Reservation.ID == 0 {
			t.Fatalf("no reservation id in %s", booked.Body)
		}
		cancel := fmt.Sprintf(`{"id":%d}`, got.Reservation.ID)
		from := url.QueryEscape(start.Format(time.RFC3339))
		cl.run(t, []call{
			{name: "reserve past the capacity", method: "POST", path: "/adminReserve", auth: admin, body: window(3, "net-201"), status: 409, code: "overbooked"},
			{name: "reserve no seats", method: "POST", path: "/adminReserve", auth: admin, body: window(0, "net-201"), status: 400, code: "bad_reservation"},
			{name: "reserve an unknown lab", method: "POST", path: "/adminReserve", auth: admin,
				body: strings.Replace(window(1, "net-201"), "linux-vm", "nope", 1), status: 400, code: "unknown_lab"},
			{name: "reserve without a token", method: "POST", path: "/adminReserve", body: window(1, "x"), status: 401, code: "unauthorized", invalid: true},
			{name: "reserve as a student", method: "POST", path: "/adminReserve", auth: tok("s"), body: window(1, "x"), status: 403, code: "forbidden"},
			{name: "reserve, not JSON", method: "POST", path: "/adminReserve", auth: admin, ctype: "text/plain", body: window(1, "x"), status: 415, code: "unsupported_media_type", invalid: true},
			{name: "reserve, too large", method: "POST", path: "/adminReserve", auth: admin, body: padded(`"course":"x"`), status: 413, code: "too_large", invalid: true},
			{name: "reservations", method: "GET", path: "/adminReservations?from=" + from, auth: admin, status: 200},
			{name: "a member's classes", method: "GET", path: "/reservations", auth: bearer(d.MemberToken("m", "cs-101")), status: 200},
			{name: "classes with a query", method: "GET", path: "/reservations?x=1", auth: tok("s"), status: 400, code: "bad_request"},
			{name: "classes without a token", method: "GET", path: "/reservations", status: 401, code: "unauthorized", invalid: true},
			{name: "reservations from no time", method: "GET", path: "/adminReservations?from=soon", auth: admin, status: 400, code: "bad_request", invalid: true},
			{name: "reservations without a token", method: "GET", path: "/adminReservations", status: 401, code: "unauthorized", invalid: true},
			{name: "reservations as a student", method: "GET", path: "/adminReservations", auth: tok("s"), status: 403, code: "forbidden"},
			{name: "cancel", method: "POST", path: "/adminCancelReservation", auth: admin, body: cancel, status: 200},
			{name: "cancel again", method: "POST", path: "/adminCancelReservation", auth: admin, body: cancel, status: 404, code: "no_reservation"},
			{name: "cancel without an id", method: "POST", path: "/adminCancelReservation", auth: admin, body: `{"id":0}`, status: 400, code: "bad_request"},
			{name: "cancel without a token", method: "POST", path: "/adminCancelReservation", body: cancel, status: 401, code: "unauthorized", invalid: true},
			{name: "cancel as a student", method: "POST", path: "/adminCancelReservation", auth: tok("s"), body: cancel, status: 403, code: "forbidden"},
			{name: "cancel, not JSON", method: "POST", path: "/adminCancelReservation", auth: admin, ctype: "text/plain", body: cancel, status: 415, code: "unsupported_media_type", invalid: true},
			{name: "cancel, too large", method: "POST", path: "/adminCancelReservation", auth: admin, body: padded(`"id":1`), status: 413, code: "too_large"},
			{name: "the freed seats", method: "POST", path: "/adminReserve", auth: admin, body: window(3, "net-201"), status: 201},
		})
	})

	t.Run("provisioning refused", func(t *testing.T) {
		refuseNetworkPolicies(t, d)
		cl.do(t, call{method: "POST", path: "/openSession", auth: tok("e"), body: `{"lab":"linux-vm"}`, status: 502, code: "provisioning_failed"})
	})

	// The database refusing connections: every operation that needs it
	// answers 500 internal, its text withheld from students.
	t.Run("database down", func(t *testing.T) {
		refuseDatabase(t, d)
		cl.run(t, []call{
			{name: "open", method: "POST", path: "/openSession", auth: tok("x"), body: `{"lab":"linux-vm"}`, status: 500, code: "internal"},
			{name: "get", method: "GET", path: "/getSession", auth: tok("x"), status: 500, code: "internal"},
			{name: "extend", method: "POST", path: "/extendSession", auth: tok("x"), status: 500, code: "internal"},
			{name: "admin sessions", method: "GET", path: "/adminSessions", auth: admin, status: 500, code: "internal"},
			{name: "admin alerts", method: "GET", path: "/adminAlerts", auth: admin, status: 500, code: "internal"},
			{name: "admin status", method: "GET", path: "/adminStatus", auth: admin, status: 500, code: "internal"},
			{name: "guardian alert", method: "POST", path: "/guardianAlert", auth: basicAuth(aID, d.App.Config.AlertKey().Token(aID)), body: alertJSON("k", "m"), status: 500, code: "internal"},
			{name: "reap now", method: "POST", path: "/adminReapNow", auth: admin, status: 500, code: "internal"},
			{name: "tick", method: "POST", path: "/reapTick", auth: scheduler, status: 500, code: "internal"},
			{name: "terminal", method: "GET", path: "/terminal/connect?session=" + aID, auth: tok("a"), header: wsUpgrade, status: 500, code: "internal"},
			{name: "cleanup", method: "POST", path: "/terminal/cleanup", auth: tok("a"), body: `{"session":"` + aID + `"}`, status: 500, code: "internal"},
			{name: "homes", method: "GET", path: "/homes", auth: tok("k"), status: 500, code: "internal"},
			{name: "archive", method: "GET", path: "/homeArchive?name=" + homeOf("k"), auth: tok("k"), status: 500, code: "internal"},
			{name: "delete a home", method: "POST", path: "/adminDeleteHome", auth: admin, body: `{"name":"` + homeOf("k") + `"}`, status: 500, code: "internal"},
			{name: "reserve", method: "POST", path: "/adminReserve", auth: admin, status: 500, code: "internal",
				body: `{"course":"c","lab":"linux-vm","seats":1,"start":"` + d.Clock.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `","end":"` + d.Clock.Now().Add(2*time.Hour).UTC().Format(time.RFC3339) + `"}`},
			{name: "reservations", method: "GET", path: "/adminReservations", auth: admin, status: 500, code: "internal"},
			{name: "a member's classes", method: "GET", path: "/reservations", auth: bearer(d.MemberToken("m", "cs-101")), status: 500, code: "internal"},
			{name: "cancel a reservation", method: "POST", path: "/adminCancelReservation", auth: admin, body: `{"id":1}`, status: 500, code: "internal"},
		})
	})

	t.Run("coverage", func(t *testing.T) {
		chk.mu.Lock()
		defer chk.mu.Unlock()
		for _, err := range chk.unchecked {
			t.Errorf("an exchange outside the calls: %v", err)
		}
		documented := chk.documented()
		var missing, stale []string
		for _, key := range documented {
			_, excluded := notExercised[key]
			switch seen := chk.seen[key] > 0; {
			case !seen && !excluded:
				missing = append(missing, key)
			case seen && excluded:
				stale = append(stale, key)
			}
		}
		for key := range notExercised {
			if !slices.Contains(documented, key) {
				stale = append(stale, key+" (not documented)")
			}
		}
		for _, name := range []string{"NotFound", "MethodNotAllowed"} {
			if chk.seen[name] == 0 {
				missing = append(missing, "an undocumented path or method answered "+name)
			}
		}
		if len(missing) > 0 {
			t.Errorf("documented but never exercised (drive them, or list them in notExercised with the reason):\n%s", strings.Join(missing, "\n"))
		}
		if len(stale) > 0 {
			slices.Sort(stale)
			t.Errorf("in notExercised but exercised after all, or not documented:\n%s", strings.Join(stale, "\n"))
		}
		t.Logf("%d documented answers, %d exercised, %d excluded", len(documented), len(documented)-len(notExercised), len(notExercised))
	})
}

// nextExtend is what the next extension of the caller's session will
// answer, judged by what getSession says of it now: 200 while extendable,
// else 409 extension_cap.
func nextExtend(t *testing.T, cl client, auth string) int {
	t.Helper()
	r := cl.do(t, call{method: "GET", path: "/getSession", auth: auth, status: 200})
	var s struct{ Extendable bool }
	if err := json.Unmarshal(r.Body, &s); err != nil {
		t.Fatal(err)
	}
	if s.Extendable {
		return http.StatusOK
	}
	return http.StatusConflict
}

// refuseNetworkPolicies makes the real API server refuse every
// NetworkPolicy create in d's sessions namespace (a
// ValidatingAdmissionPolicy, as a webhook or quota refuses in production)
// for the rest of the test: a session's provisioning creates its
// NetworkPolicy before any node, so every open fails.
func refuseNetworkPolicies(t *testing.T, d *stacktest.Deployment) {
	t.Helper()
	policies := d.Kube.NetworkingV1().NetworkPolicies(d.Namespace)
	stacktest.Refuse(t, st, stacktest.Refusal{
		Name: "openapi-refuse-" + d.Env, Namespace: d.Namespace,
		Group: "networking.k8s.io", Resource: "networkpolicies", Operations: []admissionv1.OperationType{admissionv1.Create},
		Expression: "false", Message: "injected fault: no NetworkPolicy may be created",
		Probe: func() error {
			_, err := policies.Create(context.Background(), &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		},
	})
}

// The checker can fail: answers recorded from the real handlers, mutated
// as a drifting handler would answer (a field renamed, a type changed, a
// field added, a value outside its enum, an error code under another
// status, an undocumented status, a header dropped), are each refused,
// while the answers as recorded pass.
func TestDriftIsDetected(t *testing.T) {
	doc := loadDescription(t)
	chk := newChecker(t, doc)
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 1})
	cl := newClient(d.Server.URL, chk)
	auth := bearer(d.Token("drift", "student"))
	opened := cl.do(t, call{method: "POST", path: "/openSession", auth: auth, body: `{"lab":"linux-vm"}`, status: 201})
	full := cl.do(t, call{method: "POST", path: "/openSession", auth: bearer(d.Token("other", "student")), body: `{"lab":"linux-vm"}`, status: 503, code: "no_capacity"})
	status := cl.do(t, call{method: "GET", path: "/adminStatus", auth: bearer(d.Token("ops", "admin")), status: 200})

	// check validates an answer to method path as the checker does.
	check := func(method, path string) func(status int, h http.Header, body []byte) error {
		req, err := http.NewRequest(method, d.Server.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		route, params, err := chk.router.FindRoute(req)
		if err != nil {
			t.Fatal(err)
		}
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: options}
		return func(status int, h http.Header, body []byte) error { return chk.validateResponse(in, status, h, body) }
	}
	validOpen, validStatus := check("POST", "/openSession"), check("GET", "/adminStatus")
	replace := func(body []byte, from, to string) []byte {
		if !bytes.Contains(body, []byte(from)) {
			t.Fatalf("%q is not in the recorded answer %s", from, body)
		}
		return bytes.Replace(body, []byte(from), []byte(to), 1)
	}
	noRetry := full.Header.Clone()
	noRetry.Del("Retry-After")
	tests := []struct {
		name   string
		check  func(int, http.Header, []byte) error
		status int
		header http.Header
		body   []byte
	}{
		{"a field renamed", validOpen, 201, opened.Header, replace(opened.Body, `"remainingSeconds":`, `"secondsLeft":`)},
		{"a number turned string", validOpen, 201, opened.Header, replaceValue(t, opened.Body, "remainingSeconds", `"3600"`)},
		{"a field added", validOpen, 201, opened.Header, replace(opened.Body, `{"id":`, `{"pool":"warm","id":`)},
		{"a status outside the enum", validOpen, 201, opened.Header, replaceValue(t, opened.Body, "status", `"booting"`)},
		{"a node field added", validOpen, 201, opened.Header, replace(opened.Body, `"phase":`, `"ip":"10.0.0.1","phase":`)},
		{"an undocumented status", validOpen, 200, opened.Header, opened.Body},
		{"another status's error code", validOpen, 409, full.Header, full.Body},
		{"no Retry-After on no_capacity", validOpen, 503, noRetry, full.Body},
		{"an adminStatus field added", validStatus, 200, status.Header, replace(status.Body, `{"recentRuns":`, `{"uptime":3,"recentRuns":`)},
	}
	if err := validOpen(201, opened.Header, opened.Body); err != nil {
		t.Fatalf("the recorded openSession answer itself fails: %v", err)
	}
	if err := validOpen(503, full.Header, full.Body); err != nil {
		t.Fatalf("the recorded no_capacity answer itself fails: %v", err)
	}
	if err := validStatus(200, status.Header, status.Body); err != nil {
		t.Fatalf("the recorded adminStatus answer itself fails: %v", err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.check(tc.status, tc.header, tc.body)
			if err == nil {
				t.Errorf("the drifted answer %d %s validates", tc.status, tc.body)
			}
			t.Logf("refused: %.300v", err)
		})
	}
}

// replaceValue is body (a JSON object) with its top-level field's value
// replaced by raw.
func replaceValue(t *testing.T, body []byte, field, raw string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m[field]; !ok {
		t.Fatalf("no field %s in %s", field, body)
	}
	m[field] = json.RawMessage(raw)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// publicKey is a new ed25519 public key as one authorized_keys line, a
// student's own key.
func publicKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
}
