package vmlab_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
)

// seesSerialConsole is the student's web terminal of their running VM
// session id, in a real headless Chromium: opened from the portal, it is
// the guest's serial console, through KubeVirt's
// virtualmachineinstances/console (virt-api, then virt-handler, then the
// launcher's console socket). What the student types reaches the guest's
// getty and what it writes comes back: Enter brings the login prompt, a
// user name the password prompt.
func seesSerialConsole(t *testing.T, d *stacktest.Deployment, student, id string) {
	t.Helper()
	b := browser.Start(t, browser.Isolated)
	tab := b.Tab(t)
	tab.Do(time.Minute, chromedp.Navigate(b.Reach(t, d.Server.URL)+"/portal/"), chromedp.WaitVisible(chromedp.CSS("#signin")))
	tab.Do(30*time.Second,
		chromedp.SetValue(chromedp.CSS("#token"), d.Token(student, "student")),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS("#terminal-open")))
	tab.Do(30*time.Second, chromedp.Click(chromedp.CSS("#terminal-open")))
	view := tab.WaitTerminal(time.Minute, "the serial console connected", func(v browser.TerminalView) bool {
		return strings.HasPrefix(v.Status, "Connected to the serial console of")
	})
	if want := "/portal/terminal?session=" + id; view.URL != want {
		t.Errorf("the Terminal button went to %s, want %s", view.URL, want)
	}
	tab.Do(30*time.Second, chromedp.Click(chromedp.CSS("#terminal")), browser.TypeKeys("\n"))
	tab.WaitTerminal(time.Minute, "the guest's login prompt", func(v browser.TerminalView) bool {
		return strings.Contains(v.Rows, "login:")
	})
	tab.Do(30*time.Second, browser.TypeKeys("root\n"))
	view = tab.WaitTerminal(time.Minute, "the guest's password prompt", func(v browser.TerminalView) bool {
		return strings.Contains(v.Rows, "Password:")
	})
	tab.Screenshot("serial-console")
	t.Logf("the terminal page shows: %q; xterm.js drew:\n%s", view.Status, strings.TrimRight(view.Rows, " \n"))
}
