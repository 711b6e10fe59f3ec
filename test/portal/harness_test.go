package portal_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
)

// pageState is what the student sees, read from the page's DOM.
type pageState struct {
	SignIn       bool         `json:"signin"`
	Labs         bool         `json:"labs"`
	Session      bool         `json:"session"`
	Status       string       `json:"status"`
	Phase        string       `json:"phase"`
	Nodes        []pageNode   `json:"nodes"`
	SSH          []string     `json:"ssh"`
	Remaining    string       `json:"remaining"`
	Warning      string       `json:"warning"`
	WarningText  string       `json:"warningText"`
	ExpiresAt    string       `json:"expiresAt"`
	Extend       pageExtend   `json:"extend"`
	Message      string       `json:"message"`
	MessageCode  string       `json:"messageCode"`
	PrivateKey   string       `json:"privateKey"`
	KnownHosts   string       `json:"knownHosts"`
	CloseConfirm bool         `json:"closeConfirm"`
	Open         pageOpenForm `json:"open"`
}

type pageNode struct {
	Name  string `json:"name"`
	Phase string `json:"phase"`
}

type pageExtend struct {
	Disabled bool   `json:"disabled"`
	Note     string `json:"note"`
}

type pageOpenForm struct {
	Disabled bool   `json:"disabled"`
	Note     string `json:"note"`
}

// readState is the JavaScript that reads pageState (run over DevTools,
// not by the page).
const readState = `(() => {
  const $ = (id) => document.getElementById(id);
  return {
    signin: !$("signin").hidden, labs: !$("labs").hidden, session: !$("session").hidden,
    status: $("session").dataset.status || "", phase: $("phases").dataset.phase || "",
    nodes: [...document.querySelectorAll("#nodes tbody tr")].map((tr) => ({ name: tr.dataset.node, phase: tr.dataset.phase })),
    ssh: [...document.querySelectorAll("code.ssh-command")].map((c) => c.textContent),
    remaining: $("remaining").dataset.seconds || "",
    warning: $("warning").hidden ? "" : $("warning").dataset.before, warningText: $("warning").hidden ? "" : $("warning").textContent,
    expiresAt: $("expires-at").dateTime || "",
    extend: { disabled: $("extend").disabled, note: $("extend-note").textContent },
    message: $("message").hidden ? "" : $("message").textContent, messageCode: $("message").dataset.code || "",
    privateKey: $("key").hidden ? "" : $("private-key").textContent, knownHosts: $("known-hosts").textContent,
    closeConfirm: !$("close-confirm").hidden,
    open: { disabled: $("open").disabled, note: $("open-note").textContent },
  };
})()`

// student is one student at the portal in a browser tab, on a deployment.
type student struct {
	t     *testing.T
	d     *stacktest.Deployment
	tab   *browser.Tab
	name  string
	token string
}

// visit opens the portal of d in a new tab of b as name, signed in with
// a token the portal issued.
func visit(t *testing.T, b *browser.Browser, d *stacktest.Deployment, name string) *student {
	t.Helper()
	return visitWith(t, b, d, name, d.Token(name, "student"))
}

// visitWith is visit signed in with token.
func visitWith(t *testing.T, b *browser.Browser, d *stacktest.Deployment, name, token string) *student {
	t.Helper()
	s := &student{t: t, d: d, tab: b.Tab(t), name: name, token: token}
	s.tab.Do(time.Minute, chromedp.Navigate(b.Reach(t, d.Server.URL)+"/portal/"), chromedp.WaitVisible(chromedp.CSS("#signin")))
	s.tab.Screenshot("signin")
	s.tab.Do(30*time.Second,
		chromedp.SetValue(chromedp.CSS("#token"), s.token),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS("#who")))
	return s
}

// state reads what the page shows now.
func (s *student) state() pageState {
	s.t.Helper()
	return evaluate[pageState](s, readState)
}

// evaluate runs js (over DevTools, not by the page) in s's tab and
// returns its value.
func evaluate[T any](s *student, js string) T {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.tab.Ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		s.t.Fatalf("reading the page: %v", err)
	}
	return v
}

// waitPage polls the page until cond holds, failing the test (with a
// screenshot and the last state) after timeout, a bound on a hang.
func (s *student) waitPage(what string, timeout time.Duration, cond func(pageState) bool) pageState {
	s.t.Helper()
	var last pageState
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if stacktest.Until(ctx, func() (bool, string) { last = s.state(); return cond(last), what }) != nil {
		s.tab.Screenshot("timeout")
		s.t.Fatalf("the page never showed %s within %s; last: %+v", what, timeout, last)
	}
	return last
}

func (s *student) click(sel string) {
	s.t.Helper()
	s.tab.Do(30*time.Second, chromedp.Click(chromedp.CSS(sel)))
}

// get is the student's getSession, straight from the server.
func (s *student) get() stacktest.SessionView {
	s.t.Helper()
	r := s.d.Do("GET", "/getSession", s.token, "", "")
	if r.Status != http.StatusOK {
		s.t.Fatalf("getSession = %d %s", r.Status, r.Body)
	}
	var v stacktest.SessionView
	if err := json.Unmarshal(r.Body, &v); err != nil {
		s.t.Fatal(err)
	}
	return v
}

// remaining is the page's countdown in seconds.
func remaining(t *testing.T, p pageState) int64 {
	t.Helper()
	n, err := strconv.ParseInt(p.Remaining, 10, 64)
	if err != nil {
		t.Fatalf("the countdown reads %q", p.Remaining)
	}
	return n
}

// countdownAgrees checks the page's countdown against the server's
// remainingSeconds read between two looks at the page: the server's
// figure must lie within a second of the two.
func (s *student) countdownAgrees() (page int64, api stacktest.SessionView) {
	s.t.Helper()
	before := remaining(s.t, s.state())
	api = s.get()
	after := remaining(s.t, s.state())
	if api.RemainingSeconds > before+1 || api.RemainingSeconds < after-1 {
		s.t.Errorf("countdown %d..%d s on the page, server says %d s", before, after, api.RemainingSeconds)
	}
	s.t.Logf("countdown: page %d..%d s, server %d s", before, after, api.RemainingSeconds)
	return after, api
}
