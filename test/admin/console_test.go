package admin_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
)

// consoleState is what the admin console shows, read from its DOM.
type consoleState struct {
	SignIn   bool   `json:"signin"`
	Console  bool   `json:"console"`
	Message  string `json:"message"`
	Capacity string `json:"capacity"`
	Sessions []row  `json:"sessions"`
	Failing  []row  `json:"failing"`
	Runs     []row  `json:"runs"`
	Alerts   []row  `json:"alerts"`
	Homes    []row  `json:"homes"`
	// Reservations and Timeline are the class reservations' section
	// (Booking: shown).
	Booking bool `json:"booking"`
	// AdminParts: any of the parts only an admin reads is shown; Role is
	// the role the header names beside the signed-in subject.
	AdminParts   bool      `json:"adminParts"`
	Role         string    `json:"role"`
	Reservations []row     `json:"reservations"`
	Timeline     []hourRow `json:"timeline"`
	Result       result    `json:"result"`
	ReapReady    bool      `json:"reapReady"`
}

// row is one table row: its data attributes and its cells' text.
type row struct {
	Data  map[string]string `json:"data"`
	Cells []string          `json:"cells"`
}

// hourRow is one hour of the capacity timeline: its data attributes and
// each bucket's cell's (kind, reserved, free, capacity, used).
type hourRow struct {
	Data  map[string]string   `json:"data"`
	Slots []map[string]string `json:"slots"`
}

type result struct {
	Shown    bool     `json:"shown"`
	DryRun   string   `json:"dryRun"`
	Failures string   `json:"failures"`
	Counts   string   `json:"counts"`
	Errors   []string `json:"errors"`
}

// readConsole is the JavaScript that reads consoleState (run over
// DevTools, not by the page).
const readConsole = `(() => {
  const $ = (id) => document.getElementById(id);
  const rows = (id) => [...$(id).tBodies[0].rows].map((tr) => ({ data: { ...tr.dataset }, cells: [...tr.cells].map((c) => c.textContent) }));
  return {
    signin: !$("signin").hidden, console: !$("console").hidden,
    message: $("message").hidden ? "" : $("message").textContent,
    capacity: $("capacity").textContent,
    sessions: rows("sessions"), failing: rows("failing"), runs: rows("runs"), alerts: rows("alerts"), homes: rows("homes"),
    booking: !$("reservations-section").hidden, reservations: rows("reservations"),
    adminParts: [...document.querySelectorAll(".admin-part")].some((p) => !p.hidden), role: $("who-role").textContent,
    timeline: [...$("timeline").tBodies[0].rows].map((tr) => ({ data: { ...tr.dataset }, slots: [...tr.cells].slice(1).map((c) => ({ ...c.dataset })) })),
    result: { shown: !$("reap-result").hidden, dryRun: $("reap-result").dataset.dryRun || "", failures: $("reap-result").dataset.failures || "",
      counts: $("reap-counts").textContent, errors: [...$("reap-failures").children].map((li) => li.textContent) },
    reapReady: !$("reap-now").disabled,
  };
})()`

// admin is an admin at the console in a browser tab.
type admin struct {
	t   *testing.T
	tab *browser.Tab
}

func (a admin) state() consoleState {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(a.tab.Ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[consoleState](readConsole))
	if err != nil {
		a.t.Fatalf("reading the console: %v", err)
	}
	return s
}

// wait polls the console until cond holds; after timeout (a bound on a
// hang) it fails with a screenshot and the last state.
func (a admin) wait(what string, timeout time.Duration, cond func(consoleState) bool) consoleState {
	a.t.Helper()
	var s consoleState
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if stacktest.Until(ctx, func() (bool, string) { s = a.state(); return cond(s), what }) != nil {
		a.tab.Screenshot("timeout")
		a.t.Fatalf("the console never showed %s within %s; last: %+v", what, timeout, s)
	}
	return s
}

func (a admin) click(sel string) {
	a.t.Helper()
	a.tab.Do(30*time.Second, chromedp.Click(chromedp.CSS(sel)))
}

// signIn opens d's admin console in a new tab of b with an admin token.
func signIn(t *testing.T, b *browser.Browser, d *stacktest.Deployment) admin {
	t.Helper()
	return signInWith(t, b, d, d.Token("ops", "admin"))
}

// signInWith opens d's admin console in a new tab of b with token.
func signInWith(t *testing.T, b *browser.Browser, d *stacktest.Deployment, token string) admin {
	t.Helper()
	a := admin{t: t, tab: b.Tab(t)}
	a.tab.Do(time.Minute, chromedp.Navigate(b.Reach(t, d.Server.URL)+"/portal/admin.html"), chromedp.WaitVisible(chromedp.CSS("#signin")))
	a.tab.Do(30*time.Second,
		chromedp.SetValue(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS("#console")))
	return a
}

func find(rows []row, key, value string) (row, bool) {
	for _, r := range rows {
		if r.Data[key] == value {
			return r, true
		}
	}
	return row{}, false
}

// The admin console in a real Chromium against the real stack: it lists
// the live sessions with capacity, previews a reaper run (a dry run that
// deletes nothing), runs Reap now and shows the real API server's refusal
// to delete one session's VM, that session failing run after run, a
// guardian alert of a session, and force-closes a session.
func TestAdminConsole(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 8})
	stuck := d.Opened("s-stuck", "linux-vm")
	other := d.Opened("s-other", "linux-vm")
	key := d.App.Config.AlertKey()
	for _, al := range []struct{ id, kind, msg string }{
		{stuck.ID, "fork-bomb", "contained 812 processes of bash"},
		{other.ID, "memory-kill", "killed python3"},
		{other.ID, "cpu-storm", "2 busy processes at SCHED_IDLE"},
	} {
		if status, code := post(t, d, al.id, key.Token(al.id), "application/json", alertBody(al.kind, al.msg)); status != 201 {
			t.Fatalf("guardianAlert = %d %s", status, code)
		}
	}

	b := browser.Start(t, browser.Isolated)
	a := signIn(t, b, d)
	s := a.wait("both live sessions and the alerts", 30*time.Second, func(s consoleState) bool {
		return len(s.Sessions) == 2 && len(s.Alerts) == 3
	})
	for _, want := range []struct{ id, student, alerts string }{{stuck.ID, "s-stuck", "1"}, {other.ID, "s-other", "2"}} {
		r, ok := find(s.Sessions, "session", want.id)
		if !ok || r.Data["student"] != want.student || r.Cells[1] != "linux-vm" || r.Cells[5] != want.alerts {
			t.Errorf("session %s of %s with %s alerts: %+v", want.id, want.student, want.alerts, s.Sessions)
		}
	}
	if s.Capacity != "2 / 8" {
		t.Errorf("capacity reads %q, want 2 / 8", s.Capacity)
	}
	// One session's alerts: its count opens them.
	a.click(fmt.Sprintf(`button[data-alerts-of=%q]`, stuck.ID))
	s = a.wait("stuck's alerts only", 30*time.Second, func(s consoleState) bool { return len(s.Alerts) == 1 })
	if al := s.Alerts[0]; al.Data["session"] != stuck.ID || al.Data["kind"] != "fork-bomb" || al.Cells[1] != "s-stuck" || al.Cells[6] != "contained 812 processes of bash" {
		t.Errorf("the alert row: %+v", al)
	}
	a.tab.Screenshot("sessions-and-alert")
	a.click("#alerts-all")
	a.wait("every session's alerts again", 30*time.Second, func(s consoleState) bool { return len(s.Alerts) == 3 })

	// Both sessions expire; the API server refuses to delete stuck's VM.
	d.Clock.Advance(61 * time.Minute)
	d.RefuseVMDeletes(t, st, stuck.ID)

	a.click("#reap-preview")
	s = a.wait("the preview's result", 60*time.Second, func(s consoleState) bool { return s.Result.Shown && s.ReapReady })
	if s.Result.DryRun != "true" || s.Result.Counts != "Would reap: expired 2" || s.Result.Failures != "0" {
		t.Errorf("preview result: %+v", s.Result)
	}
	if live := d.LiveIDs(); !live[stuck.ID] || !live[other.ID] {
		t.Fatalf("the preview ended sessions: live now %v", live)
	}
	a.tab.Screenshot("preview")

	for run := 1; run <= 2; run++ {
		a.click("#reap-now")
		s = a.wait(fmt.Sprintf("run %d's refusal", run), 90*time.Second, func(s consoleState) bool {
			f, ok := find(s.Failing, "session", stuck.ID)
			return s.Result.DryRun == "false" && ok && f.Data["runs"] == fmt.Sprint(run) && s.ReapReady
		})
		if s.Result.Failures != "1" || len(s.Result.Errors) != 1 || !contains(s.Result.Errors[0], stuck.ID, "injected fault: deleting this VM is refused") {
			t.Errorf("run %d result: %+v", run, s.Result)
		}
	}
	f, _ := find(s.Failing, "session", stuck.ID)
	if !contains(f.Cells[3], "injected fault: deleting this VM is refused") {
		t.Errorf("failing row: %+v", f)
	}
	if _, ok := find(s.Sessions, "session", other.ID); ok {
		t.Errorf("the other session is still listed live after Reap now: %+v", s.Sessions)
	}
	a.tab.Screenshot("reap-now-refused")

	// Force-close a fresh session: the first click asks, the second closes.
	third := d.Opened("s-third", "linux-vm")
	a.wait("the new session", 30*time.Second, func(s consoleState) bool { _, ok := find(s.Sessions, "session", third.ID); return ok })
	sel := fmt.Sprintf(`button[data-close=%q]`, third.ID)
	a.click(sel)
	if got := d.Session(third.ID).Status; got != "running" && got != "provisioning" {
		t.Fatalf("one click closed the session (%s)", got)
	}
	a.tab.Screenshot("close-armed")
	a.click(sel)
	stacktest.Eventually(t, 60*time.Second, func() (bool, string) {
		got := d.Session(third.ID)
		return got.Status == "closed", fmt.Sprintf("session is %s", got.Status)
	})
	s = a.wait("the closed session gone", 30*time.Second, func(s consoleState) bool { _, ok := find(s.Sessions, "session", third.ID); return !ok })
	if got := d.Session(third.ID).End.String(); !contains(got, "closed by admin") {
		t.Errorf("end reason %q, want closed by admin", got)
	}
	a.tab.Screenshot("closed")
}

func contains(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
