package admin_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/localrun/stacktest"
	"labkeep/shared/alerts"
)

// alertBody is an alert as guardian posts it (guardian/alert.Alert's JSON),
// written out here so a change of the wire format breaks this test as it
// would break guardian.
func alertBody(kind, message string) string {
	return fmt.Sprintf(`{"kind":%q,"subject":"pid 4242","severity":"critical","message":%q,"fields":{"pid":"4242","comm":"python3"},`+
		`"workspace":"ws-1","first":"2026-12-01T10:00:00Z","last":"2026-12-01T10:00:03Z","count":2}`, kind, message)
}

// post sends body to POST /guardianAlert with HTTP Basic credentials user
// and pass (none when user is empty), as guardian does, and returns the
// status and the error code of the answer ("" for a success).
func post(t *testing.T, d *stacktest.Deployment, user, pass, ctype, body string) (int, string) {
	t.Helper()
	a := postAlert(t, d, user, pass, ctype, body)
	return a.Status, a.Code
}

// postAnswer is an answer of POST /guardianAlert: its status, its error
// code ("" for a success) and its Retry-After.
type postAnswer struct {
	Status     int
	Code       string
	RetryAfter string
}

// postAlert is post's request, answering with the Retry-After too. An
// error answer that is not labkeep's error body fails the test.
func postAlert(t *testing.T, d *stacktest.Deployment, user, pass, ctype, body string) postAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, d.Server.URL+"/guardianAlert", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	a := postAnswer{Status: res.StatusCode, RetryAfter: res.Header.Get("Retry-After")}
	if res.StatusCode < 300 {
		return a
	}
	var eb struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal(raw, &eb); err != nil || eb.Error.Code == "" {
		t.Fatalf("guardianAlert answered %d without labkeep's error body: %q", res.StatusCode, raw)
	}
	a.Code = eb.Error.Code
	return a
}

// stored is what the database holds for a session: the kinds, oldest first.
func stored(t *testing.T, d *stacktest.Deployment, id string) []string {
	t.Helper()
	rows, err := d.DB.Query(t.Context(), `SELECT kind FROM guardian_alerts WHERE session_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	kinds := []string{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, k)
	}
	return kinds
}

// The alert endpoint on the real stack and PostgreSQL: only a session's own
// credentials store an alert for it (another session's token, a token of
// another environment, a forged or missing one are refused), a bad alert
// is refused with a clear error and stores nothing, and a session keeps
// only its newest alerts.
func TestGuardianAlertEndpoint(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 8})
	a := d.Opened("alert-a", "linux-vm")
	b := d.Opened("alert-b", "linux-vm")
	key := d.App.Config.AlertKey()
	other := alerts.Key{Secret: key.Secret, Env: key.Env + "-other"}
	ok := alertBody("memory-kill", "killed python3 (3.9 GiB)")

	tests := []struct {
		name       string
		user, pass string
		ctype      string
		body       string
		wantStatus int
		wantCode   string
	}{
		{"its own session's credentials", a.ID, key.Token(a.ID), "application/json", ok, 201, ""},
		{"another session's token", a.ID, key.Token(b.ID), "application/json", ok, 401, "unauthorized"},
		{"a token of another environment", a.ID, other.Token(a.ID), "application/json", ok, 401, "unauthorized"},
		{"a forged token", a.ID, strings.Repeat("0", 64), "application/json", ok, 401, "unauthorized"},
		{"no credentials", "", "", "application/json", ok, 401, "unauthorized"},
		{"the id in capitals", strings.ToUpper(a.ID), key.Token(strings.ToUpper(a.ID)), "application/json", ok, 401, "unauthorized"},
		{"not a session id", "admin", key.Token("admin"), "application/json", ok, 401, "unauthorized"},
		{"a session that does not exist", "00000000-0000-4000-8000-000000000000", key.Token("00000000-0000-4000-8000-000000000000"), "application/json", ok, 404, "no_session"},
		{"not JSON", a.ID, key.Token(a.ID), "application/json", "kind=x", 400, "bad_request"},
		{"not application/json", a.ID, key.Token(a.ID), "text/plain", ok, 415, "unsupported_media_type"},
		{"a session chosen in the body", a.ID, key.Token(a.ID), "application/json", strings.Replace(ok, `{"kind"`, `{"session":"`+b.ID+`","kind"`, 1), 400, "bad_request"},
		{"a message beyond the bound", a.ID, key.Token(a.ID), "application/json", alertBody("memory-kill", strings.Repeat("x", 513)), 400, "invalid_alert"},
		{"a terminal escape", a.ID, key.Token(a.ID), "application/json", strings.Replace(alertBody("memory-kill", "ESC"), `"ESC"`, `"\u001b[2J"`, 1), 400, "invalid_alert"},
		{"no kind", a.ID, key.Token(a.ID), "application/json", alertBody("", "m"), 400, "invalid_alert"},
		{"an unknown severity", a.ID, key.Token(a.ID), "application/json", strings.Replace(ok, `"critical"`, `"fatal"`, 1), 400, "invalid_alert"},
		{"a body beyond 64 KiB", a.ID, key.Token(a.ID), "application/json", alertBody("memory-kill", strings.Repeat("x", 70<<10)), 413, "too_large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, code := post(t, d, tc.user, tc.pass, tc.ctype, tc.body)
			if status != tc.wantStatus || code != tc.wantCode {
				t.Errorf("guardianAlert = %d %q, want %d %q", status, code, tc.wantStatus, tc.wantCode)
			}
		})
	}
	if diff := cmp.Diff([]string{"memory-kill"}, stored(t, d, a.ID)); diff != "" {
		t.Errorf("alerts stored for A (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{}, stored(t, d, b.ID)); diff != "" {
		t.Errorf("alerts stored for B, whose credentials were never used (-want +got):\n%s", diff)
	}

	// The admin sees A's alert as stored, with the session the credentials
	// named; a student may not read alerts.
	r := d.Do("GET", "/adminAlerts?session="+a.ID, d.Token("ops", "admin"), "", "")
	var got struct{ Alerts []alerts.Alert }
	if err := json.Unmarshal(r.Body, &got); r.Status != 200 || err != nil || len(got.Alerts) != 1 {
		t.Fatalf("adminAlerts = %d %s", r.Status, r.Body)
	}
	al := got.Alerts[0]
	want := []string{a.ID, "memory-kill", "pid 4242", "critical", "killed python3 (3.9 GiB)", "python3", "ws-1", "2"}
	if diff := cmp.Diff(want, []string{al.Session, al.Kind, al.Subject, string(al.Severity), al.Message, al.Fields["comm"], al.Workspace, fmt.Sprint(al.Count)}); diff != "" {
		t.Errorf("the stored alert (-want +got):\n%s", diff)
	}
	if r := d.Do("GET", "/adminAlerts", d.Token("alert-a", "student"), "", ""); r.Status != 403 {
		t.Errorf("adminAlerts as a student = %d %s, want 403", r.Status, r.Body)
	}
	for _, q := range []string{"?session=x", "?limit=0", "?limit=501", "?student=alert-a"} {
		if r := d.Do("GET", "/adminAlerts"+q, d.Token("ops", "admin"), "", ""); r.Status != 400 {
			t.Errorf("adminAlerts%s = %d %s, want 400", q, r.Status, r.Body)
		}
	}

	// The per-session cap: B posts more than it keeps, a window of the
	// rate at a time; the newest stay.
	keep, lim := d.App.Config.Alerts.PerSession, d.App.Config.Alerts
	for i := range keep + 3 {
		if i%lim.PerWindow == 0 {
			d.Clock.Advance(lim.Window)
		}
		if status, code := post(t, d, b.ID, key.Token(b.ID), "application/json", alertBody(fmt.Sprintf("k%d", i), "m")); status != 201 {
			t.Fatalf("alert %d of B = %d %s", i, status, code)
		}
	}
	kinds := stored(t, d, b.ID)
	if len(kinds) != keep || kinds[0] != "k3" || kinds[len(kinds)-1] != fmt.Sprintf("k%d", keep+2) {
		t.Errorf("B keeps %d alerts %s … %s, want its newest %d: k3 … k%d", len(kinds), kinds[0], kinds[len(kinds)-1], keep, keep+2)
	}
	// Many guardian deliveries at once (a workspace's aggregator retrying,
	// several labkeep replicas): the cap still holds exactly.
	d.Clock.Advance(lim.Window)
	var wg sync.WaitGroup
	for w := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				if status, code := post(t, d, b.ID, key.Token(b.ID), "application/json", alertBody(fmt.Sprintf("c%d-%d", w, i), "m")); status != 201 {
					t.Errorf("concurrent alert = %d %s", status, code)
				}
			}
		}()
	}
	wg.Wait()
	if n := len(stored(t, d, b.ID)); n != keep {
		t.Errorf("after 50 concurrent alerts B keeps %d, want %d", n, keep)
	}
	if diff := cmp.Diff([]string{"memory-kill"}, stored(t, d, a.ID)); diff != "" {
		t.Errorf("B's alerts changed A's (-want +got):\n%s", diff)
	}
}

// postWithRetry posts body as JSON with the workspace's credentials.
func postWithRetry(t *testing.T, d *stacktest.Deployment, user, pass, body string) postAnswer {
	t.Helper()
	return postAlert(t, d, user, pass, "application/json", body)
}

// A workspace's credentials are bounded in rate and in time, on the real
// stack and PostgreSQL: past GUARDIAN_ALERTS_PER_WINDOW in a window its
// alerts get 429 too_many_alerts with when to retry and nothing is
// stored, and after it waited as told one is taken again; once its
// session ended, its alerts are taken for GUARDIAN_ALERTS_AFTER_END (the
// Pod's last words), then refused 401 with nothing stored. Another
// session's rate is its own.
func TestGuardianAlertRateAndExpiry(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 8})
	a := d.Opened("rate-a", "linux-vm")
	b := d.Opened("rate-b", "linux-vm")
	key, lim := d.App.Config.AlertKey(), d.App.Config.Alerts
	if lim.PerWindow < 2 || lim.AfterEnd <= 0 {
		t.Fatalf("alert limits %+v: this test needs a rate and a time after the end", lim)
	}
	body := func(i int) string { return alertBody(fmt.Sprintf("r%d", i), "m") }
	// Frozen: the answer's Retry-After is exact to the second, and 60 real
	// posts on a loaded machine take more than one.
	d.Clock.Set(d.Clock.Now())

	// A fills its window in half of it; the next is refused until the
	// first of them leaves the window.
	space := lim.Window / time.Duration(2*lim.PerWindow)
	for i := range lim.PerWindow {
		if got := postWithRetry(t, d, a.ID, key.Token(a.ID), body(i)); got.Status != 201 {
			t.Fatalf("alert %d of %d in the window = %+v, want 201", i+1, lim.PerWindow, got)
		}
		d.Clock.Advance(space)
	}
	waited := time.Duration(lim.PerWindow) * space
	want := postAnswer{429, "too_many_alerts", strconv.Itoa(int(math.Ceil((lim.Window - waited).Seconds())))}
	if got := postWithRetry(t, d, a.ID, key.Token(a.ID), body(-1)); got != want {
		t.Errorf("one alert past the rate = %+v, want %+v", got, want)
	}
	if n := len(stored(t, d, a.ID)); n != lim.PerWindow {
		t.Errorf("A keeps %d alerts after the refused one, want %d", n, lim.PerWindow)
	}
	if got := postWithRetry(t, d, b.ID, key.Token(b.ID), body(0)); got.Status != 201 {
		t.Errorf("B's alert while A is at its rate = %+v, want 201 (a rate per session)", got)
	}
	d.Clock.Advance(lim.Window - waited)
	if got := postWithRetry(t, d, a.ID, key.Token(a.ID), body(lim.PerWindow)); got.Status != 201 {
		t.Errorf("A's alert after waiting as told = %+v, want 201", got)
	}

	// B closes: its guardian's last alerts are taken for AfterEnd, then its
	// credentials are worth nothing.
	if r := d.Do("POST", "/closeSession", d.Token("rate-b", "student"), "", ""); r.Status != 200 {
		t.Fatalf("close B = %d %s", r.Status, r.Body)
	}
	if got := postWithRetry(t, d, b.ID, key.Token(b.ID), body(1)); got.Status != 201 {
		t.Errorf("B's alert just after its close = %+v, want 201", got)
	}
	d.Clock.Advance(lim.AfterEnd + time.Second)
	if got := postWithRetry(t, d, b.ID, key.Token(b.ID), body(2)); got != (postAnswer{Status: 401, Code: "unauthorized"}) {
		t.Errorf("B's alert %s after its close = %+v, want 401 unauthorized", lim.AfterEnd+time.Second, got)
	}
	if diff := cmp.Diff([]string{"r0", "r1"}, stored(t, d, b.ID)); diff != "" {
		t.Errorf("alerts stored for B (-want +got):\n%s", diff)
	}
}

// The admin endpoints refuse students and bad input, and change nothing.
func TestAdminEndpointsRefuse(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 8})
	s := d.Opened("refuse-a", "linux-vm")
	d.Clock.Advance(61 * time.Minute) // expired: a real run would reap it
	student, admin := d.Token("refuse-a", "student"), d.Token("ops", "admin")
	tests := []struct {
		name, method, path, token, body string
		wantStatus                      int
		wantCode                        string
	}{
		{"sessions as a student", "GET", "/adminSessions", student, "", 403, "forbidden"},
		{"sessions without a token", "GET", "/adminSessions", "", "", 401, "unauthorized"},
		{"sessions with a query", "GET", "/adminSessions?student=refuse-a", admin, "", 400, "bad_request"},
		{"sessions by POST", "POST", "/adminSessions", admin, "", 405, "method_not_allowed"},
		{"alerts as a student", "GET", "/adminAlerts", student, "", 403, "forbidden"},
		{"a preview as a student", "POST", "/adminReapNow", student, `{"dryRun":true}`, 403, "forbidden"},
		{"guardianAlert by GET", "GET", "/guardianAlert", "", "", 405, "method_not_allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := d.Do(tc.method, tc.path, tc.token, tc.body, "")
			if r.Status != tc.wantStatus || r.Code != tc.wantCode {
				t.Errorf("%s %s = %d %q, want %d %q", tc.method, tc.path, r.Status, r.Code, tc.wantStatus, tc.wantCode)
			}
		})
	}
	if n := d.Count(`SELECT count(*) FROM reap_runs`); n != 0 {
		t.Errorf("%d reaper runs recorded by refused calls", n)
	}
	if live := d.LiveIDs(); !live[s.ID] {
		t.Errorf("the session ended: live %v", live)
	}

	// The admin's own calls: the live session listed, a preview that
	// deletes nothing.
	r := d.Do("GET", "/adminSessions", admin, "", "")
	var list struct {
		Sessions []struct{ ID, Student, Lab, Status string }
	}
	if err := json.Unmarshal(r.Body, &list); r.Status != 200 || err != nil || len(list.Sessions) != 1 ||
		list.Sessions[0].ID != s.ID || list.Sessions[0].Student != "refuse-a" || list.Sessions[0].Status != "expired" {
		t.Errorf("adminSessions = %d %s", r.Status, r.Body)
	}
	r = d.Do("POST", "/adminReapNow", admin, `{"dryRun":true}`, "")
	var run struct {
		DryRun bool           `json:"dryRun"`
		Counts map[string]int `json:"counts"`
	}
	if err := json.Unmarshal(r.Body, &run); r.Status != 200 || err != nil || !run.DryRun || run.Counts["expired"] != 1 {
		t.Errorf("adminReapNow dry run = %d %s", r.Status, r.Body)
	}
	if live := d.LiveIDs(); !live[s.ID] {
		t.Errorf("the preview ended the session: live %v", live)
	}
}
