package portal_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"labkeep/localrun/browser"
	"labkeep/localrun/devserve"
	"labkeep/localrun/stacktest"
	"labkeep/shared/portal"
)

// `make run` serves the portal beside the functions, and the student
// token it prints signs in there and lists the sample labs; with
// LABKEEP_PORTAL=false the page is not served.
func TestMakeRunServesThePortal(t *testing.T) {
	srv := makeRun(t, "")
	if srv.App.Portal == nil {
		t.Fatal("make run serves no portal by default")
	}
	b := browser.Start(t, browser.Isolated)
	tab := b.Tab(t)
	tab.Do(time.Minute, chromedp.Navigate(b.Reach(t, srv.URL)+portal.Prefix), chromedp.WaitVisible(chromedp.CSS("#signin")))
	tab.Do(30*time.Second,
		chromedp.SetValue(chromedp.CSS("#token"), srv.StudentToken),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS(`input[name="lab"]`)))
	tab.Screenshot("make-run-labs")
	ctx, cancel := context.WithTimeout(tab.Ctx, 10*time.Second)
	defer cancel()
	labs, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('input[name="lab"]')].map((i) => i.value)`))
	if err != nil {
		t.Fatal(err)
	}
	if want := srv.App.Labs.Names(); !slices.Equal(labs, want) {
		t.Errorf("labs on the page %v, want the sample labs %v", labs, want)
	}
	who, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("#who-name")))
	if err != nil || who != devserve.SampleStudent {
		t.Errorf("signed in as %q (%v), want %q", who, err, devserve.SampleStudent)
	}
}

// LABKEEP_PORTAL=false serves no page: /portal/ is the API's JSON 404.
func TestPortalOff(t *testing.T) {
	srv := makeRun(t, "false")
	if srv.App.Portal != nil {
		t.Error("LABKEEP_PORTAL=false still mounts the portal")
	}
	r := stacktest.NewClient(t, srv.URL).Do("GET", portal.Prefix, "", "", "")
	if r.Status != 404 || r.Code != "not_found" {
		t.Errorf("GET %s = %d %s, want the API's 404 not_found", portal.Prefix, r.Status, r.Body)
	}
}

// makeRun starts what `make run` serves on the test's stack
// (stacktest.MakeRun), with LABKEEP_PORTAL set to portalSetting unless
// empty.
func makeRun(t *testing.T, portalSetting string) *devserve.Server {
	t.Helper()
	settings := map[string]string{}
	if portalSetting != "" {
		settings["LABKEEP_PORTAL"] = portalSetting
	}
	return stacktest.MakeRun(t, st, settings, nil)
}
