package session_test

import (
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/go-cmp/cmp"

	"labkeep/localrun/stacktest"
	"labkeep/shared/access"
	"labkeep/shared/httpapi"
)

// Bad input of every kind gets a clear error, and neither the
// database nor the cluster changes.
func TestBadInputChangesNothing(t *testing.T) {
	e := newEnv(t, stacktest.Options{})
	// Another student's live session, which the bad requests must not reach.
	vid := e.Opened("victim", "linux-vm").ID
	e.WaitRunning("victim", 30*time.Second)

	student := e.Token("mallory", "student")
	expired, _ := access.Sign([]byte(stacktest.JWTSecret), "mallory", "student", time.Now().Add(-time.Minute))
	wrongKey, _ := access.Sign([]byte("another-secret-0123456789abcdef-xyz"), "mallory", "student", time.Now().Add(time.Hour))
	noExp, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "mallory", "role": "student"}).SignedString([]byte(stacktest.JWTSecret))
	noSub, _ := access.Sign([]byte(stacktest.JWTSecret), "", "student", time.Now().Add(time.Hour))
	badRole, _ := access.Sign([]byte(stacktest.JWTSecret), "mallory", "root", time.Now().Add(time.Hour))
	hs512, _ := jwt.NewWithClaims(jwt.SigningMethodHS512, jwt.MapClaims{"sub": "mallory", "role": "student", "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(stacktest.JWTSecret))
	tooLong, _ := access.Sign([]byte(stacktest.JWTSecret), "mallory", "student", time.Now().Add(365*24*time.Hour))
	future, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "mallory", "role": "student", "iat": time.Now().Add(time.Hour).Unix(), "exp": time.Now().Add(2 * time.Hour).Unix()}).SignedString([]byte(stacktest.JWTSecret))
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "mallory", "role": "admin", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	huge := `{"lab":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `"}`

	tests := []struct {
		name, method, path, token, body, ctype string
		wantStatus                             int
		wantCode, wantMessage                  string
	}{
		{"no token", "POST", "/openSession", "", `{"lab":"linux-vm"}`, "", 401, "unauthorized", "missing Authorization"},
		{"expired token", "POST", "/openSession", expired, `{"lab":"linux-vm"}`, "", 401, "unauthorized", "expired"},
		{"wrong key", "POST", "/openSession", wrongKey, `{"lab":"linux-vm"}`, "", 401, "unauthorized", "signature"},
		{"no exp", "POST", "/openSession", noExp, `{"lab":"linux-vm"}`, "", 401, "unauthorized", "exp"},
		{"token valid for a year", "POST", "/openSession", tooLong, `{"lab":"linux-vm"}`, "", 401, "unauthorized", "over the maximum lifetime"},
		{"token issued in the future", "POST", "/openSession", future, `{"lab":"linux-vm"}`, "", 401, "unauthorized", "issued in the future"},
		{"no sub", "POST", "/openSession", noSub, `{"lab":"linux-vm"}`, "", 401, "unauthorized", "sub"},
		{"unknown role", "POST", "/openSession", badRole, `{"lab":"linux-vm"}`, "", 401, "unauthorized", "role"},
		{"HS512 token", "POST", "/openSession", hs512, `{"lab":"linux-vm"}`, "", 401, "unauthorized", "signing method"},
		{"alg none token", "POST", "/openSession", none, `{"lab":"linux-vm"}`, "", 401, "unauthorized", "invalid token"},
		{"garbage token", "POST", "/openSession", "not.a.jwt", `{"lab":"linux-vm"}`, "", 401, "unauthorized", "invalid token"},
		{"malformed JSON", "POST", "/openSession", student, `{"lab":`, "", 400, "bad_request", "invalid JSON"},
		{"JSON array", "POST", "/openSession", student, `["linux-vm"]`, "", 400, "bad_request", "invalid JSON"},
		{"trailing data", "POST", "/openSession", student, `{"lab":"linux-vm"} {}`, "", 400, "bad_request", "after the object"},
		{"unknown field", "POST", "/openSession", student, `{"lab":"linux-vm","hours":9}`, "", 400, "bad_request", "unknown field"},
		{"wrong type", "POST", "/openSession", student, `{"lab":7}`, "", 400, "bad_request", "invalid JSON"},
		{"empty body", "POST", "/openSession", student, ``, "", 400, "bad_request", "body is required"},
		{"missing lab", "POST", "/openSession", student, `{}`, "", 400, "bad_request", "lab"},
		{"unknown lab lists valid ones", "POST", "/openSession", student, `{"lab":"windows"}`, "", 400, "unknown_lab", "valid labs: k8s-cluster, linux-vm, shell"},
		{"body over 64 KiB", "POST", "/openSession", student, huge, "", 413, "too_large", "65536"},
		{"text/plain", "POST", "/openSession", student, `{"lab":"linux-vm"}`, "text/plain", 415, "unsupported_media_type", "application/json"},
		{"form content type", "POST", "/openSession", student, `lab=linux-vm`, "application/x-www-form-urlencoded", 415, "unsupported_media_type", "application/json"},
		{"GET on openSession", "GET", "/openSession", student, ``, "", 405, "method_not_allowed", "use POST"},
		{"POST on getSession", "POST", "/getSession", student, `{}`, "", 405, "method_not_allowed", "use GET"},
		{"unknown path", "GET", "/deleteEverything", student, ``, "", 404, "not_found", "no endpoint"},
		{"student acting for another", "POST", "/openSession", student, `{"lab":"linux-vm","student":"victim"}`, "", 403, "forbidden", "own session"},
		{"get another's session by id", "GET", "/getSession?id=" + vid, student, ``, "", 404, "no_session", ""},
		{"get another's session by student", "GET", "/getSession?student=victim", student, ``, "", 403, "forbidden", ""},
		{"get with a malformed id", "GET", "/getSession?id=%27%3B%20DROP%20TABLE%20sessions", student, ``, "", 404, "no_session", ""},
		{"unknown query parameter", "GET", "/getSession?all=1", student, ``, "", 400, "bad_request", "unknown query parameter"},
		{"extend another's session", "POST", "/extendSession", student, `{"id":"` + vid + `"}`, "", 404, "no_session", ""},
		{"close another's session", "POST", "/closeSession", student, `{"id":"` + vid + `"}`, "", 404, "no_session", ""},
		{"close for another", "POST", "/closeSession", student, `{"student":"victim"}`, "", 403, "forbidden", ""},
		{"extend without a session", "POST", "/extendSession", student, ``, "", 404, "no_session", ""},
		{"close without a session", "POST", "/closeSession", student, ``, "", 404, "no_session", ""},
		{"get without a session", "GET", "/getSession", student, ``, "", 404, "no_session", ""},
		{"extend with unknown field", "POST", "/extendSession", student, `{"hours":5}`, "", 400, "bad_request", "unknown field"},
		{"close with wrong content type", "POST", "/closeSession", student, `{}`, "text/xml", 415, "unsupported_media_type", ""},
	}
	rowsBefore, objectsBefore := e.Rows(), e.Objects("")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.Do(tc.method, tc.path, tc.token, tc.body, tc.ctype)
			if r.Status != tc.wantStatus || r.Code != tc.wantCode || !strings.Contains(r.Message, tc.wantMessage) {
				t.Errorf("= %d %q %q, want %d %q containing %q", r.Status, r.Code, r.Message, tc.wantStatus, tc.wantCode, tc.wantMessage)
			}
			if r.Status == 401 && r.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			if r.Status == 405 && r.Header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
	}
	if diff := cmp.Diff(rowsBefore, e.Rows()); diff != "" {
		t.Errorf("database changed (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(objectsBefore, e.Objects("")); diff != "" {
		t.Errorf("cluster changed (-before +after):\n%s", diff)
	}
	// The victim's session is untouched and still theirs.
	if g := e.Do("GET", "/getSession", e.Token("victim", "student"), "", ""); g.Status != 200 || g.Session.ID != vid || g.Session.Status != "running" {
		t.Errorf("victim's session = %d %s", g.Status, g.Body)
	}
	// An admin may read it.
	if g := e.Do("GET", "/getSession?student=victim", e.Token("teacher", "admin"), "", ""); g.Status != 200 || g.Session.ID != vid {
		t.Errorf("admin get = %d %s", g.Status, g.Body)
	}
}

// A session whose VMs never boot stays provisioning: it cannot be
// extended (409 not_running) and closing it still removes everything.
func TestNeverReadySessionCannotBeExtended(t *testing.T) {
	e := newEnv(t, stacktest.Options{EnvPrefix: neverReady})
	tok := e.Token("dave", "student")
	e.Opened("dave", "linux-vm")
	time.Sleep(3 * bootDelay)
	g := e.Do("GET", "/getSession", tok, "", "")
	if g.Session.Status != "provisioning" || g.Session.Nodes[0].Ready || g.Session.Extendable {
		t.Errorf("get = %s", g.Body)
	}
	r := e.Do("POST", "/extendSession", tok, "", "")
	if r.Status != 409 || r.Code != "not_running" || r.Session.Status != "provisioning" {
		t.Errorf("extend = %d %s", r.Status, r.Body)
	}
	if r := e.Open("dave", "shell"); r.Status != 409 || r.Code != "session_exists" {
		t.Errorf("second open = %d %s", r.Status, r.Body)
	}
	if c := e.Do("POST", "/closeSession", tok, "", ""); c.Status != 200 {
		t.Fatalf("close = %d %s", c.Status, c.Body)
	}
	e.WaitNoObjects()
}
