package podlab_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
)

// In a real headless Chromium, the student signs in to the portal, opens
// the terminal of their running shell lab with its button, types id into
// xterm.js, and reads root's id from the real workspace container; then,
// back on the portal, the Cleanup button kills CPU hogs started over SSH and
// reports what guardian killed, and SSH works after it. The
// pages run under their Content-Security-Policy: a violation or an
// uncaught exception fails the test.
func TestWebTerminalInTheBrowser(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{})
	s := openLab(t, d, "wendy", "shell", nil)
	s.waitRunning(3 * time.Minute)

	b := browser.Start(t, browser.Isolated)
	tab := b.Tab(t)
	tab.Do(time.Minute, chromedp.Navigate(b.Reach(t, d.Server.URL)+"/portal/"), chromedp.WaitVisible(chromedp.CSS("#signin")))
	tab.Do(30*time.Second,
		chromedp.SetValue(chromedp.CSS("#token"), d.Token("wendy", "student")),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS("#terminal-open")),
		chromedp.WaitVisible(chromedp.CSS("#terminal-cleanup")))
	tab.Screenshot("portal-with-terminal-buttons")

	tab.Do(30*time.Second, chromedp.Click(chromedp.CSS("#terminal-open")))
	view := tab.WaitTerminal(time.Minute, "the terminal connected", func(v browser.TerminalView) bool {
		return strings.HasPrefix(v.Status, "Connected to your workspace container")
	})
	if want := "/portal/terminal?session=" + s.opened.ID; view.URL != want {
		t.Errorf("the Terminal button went to %s, want %s", view.URL, want)
	}
	tab.Do(30*time.Second, chromedp.Click(chromedp.CSS("#terminal")), browser.TypeKeys("id\n"))
	view = tab.WaitTerminal(time.Minute, "the output of id", func(v browser.TerminalView) bool {
		return strings.Contains(v.Rows, "uid=0(root) gid=0(root)")
	})
	tab.Screenshot("terminal-id")
	t.Logf("the terminal page shows: %q; xterm.js drew:\n%s", view.Status, lastLines(strings.TrimRight(view.Rows, " \n"), 4))

	s.waitSSH(time.Minute)
	s.mustRun(`for i in 1 2 3; do setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & done`)
	hogs := pids(t, s.mustRun(`sleep 1; pgrep -f 'while :; do :; d[o]ne'`))
	if len(hogs) != 3 {
		t.Fatalf("hogs running: %v, want 3", hogs)
	}
	tab.Do(time.Minute, chromedp.Navigate(b.Reach(t, d.Server.URL)+"/portal/"), chromedp.WaitVisible(chromedp.CSS("#terminal-cleanup")),
		chromedp.Click(chromedp.CSS("#terminal-cleanup")))
	var note string
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		ctx, cancel := context.WithTimeout(tab.Ctx, 10*time.Second)
		defer cancel()
		n, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#terminal-note")))
		note = n
		return err == nil && strings.HasPrefix(n, "Killed "), "cleanup note: " + n
	})
	tab.Screenshot("portal-after-cleanup")
	if left := strings.TrimSpace(s.mustRun(`pgrep -f 'while :; do :; d[o]ne' | wc -l`)); left != "0" {
		t.Errorf("%s hogs of %v left after the Cleanup button", left, hogs)
	}
	t.Logf("the Cleanup button: %q; the hogs %v are gone and SSH works after it", note, hogs)
	// Every file the pages asked for loaded (xterm.js, its CSS, the
	// scripts): the only miss allowed is the browser's own favicon request.
	var misses []string
	for _, m := range tab.Console() {
		if m.Source != "network" {
			continue
		}
		misses = append(misses, m.URL)
		if !strings.HasSuffix(m.URL, "/favicon.ico") {
			t.Errorf("a resource failed to load: %s (%s)", m, m.URL)
		}
	}
	t.Logf("requests that failed: %v", misses)
}
