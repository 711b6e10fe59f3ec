package vmlab_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"labkeep/localrun/browser"
	"labkeep/localrun/images"
	"labkeep/localrun/stacktest"
)

// bigVMLab is a catalog of one VM lab asking for more memory than the
// local node has.
var bigVMLab = fmt.Sprintf(`labs:
  - name: big-vm
    description: One VM larger than any node here.
    kind: vm
    nodes:
      - {role: vm, cpu: "1", memory: 64Gi}
    disk:
      containerDisk: %s
`, images.GuestDebian)

// A VM the cluster cannot place says so, with KubeVirt's copy of the
// scheduler's reason, wherever the session is shown: getSession's node
// phase and phaseReason, the student's portal and the admin console, in a
// real Chromium. Without it the node would read "scheduled" until the
// provision timeout failed the open.
func TestUnschedulableVMSaysWhy(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: bigVMLab})
	s := d.Opened("uma", "big-vm")
	var node stacktest.NodeView
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		r := d.Do("GET", "/getSession", d.Token("uma", "student"), "", "")
		if r.Status != http.StatusOK || len(r.Session.Nodes) != 1 {
			return false, fmt.Sprintf("%d %s", r.Status, r.Body)
		}
		node = r.Session.Nodes[0]
		return node.Phase == "unschedulable", fmt.Sprintf("session %s, node phase %q", r.Session.Status, node.Phase)
	})
	if !strings.Contains(node.PhaseReason, "Insufficient memory") {
		t.Errorf("phaseReason %q does not give the scheduler's reason (Insufficient memory)", node.PhaseReason)
	}
	t.Logf("getSession: node %s is %s: %q", node.Name, node.Phase, node.PhaseReason)

	b := browser.Start(t, browser.Isolated)
	url := b.Reach(t, d.Server.URL)
	tab := b.Tab(t)
	tab.Do(time.Minute, chromedp.Navigate(url+"/portal/"), chromedp.WaitVisible(chromedp.CSS("#signin")))
	tab.Do(time.Minute,
		chromedp.SetValue(chromedp.CSS("#token"), d.Token("uma", "student")),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS("#unschedulable")))
	portal := text(t, tab, "#unschedulable")
	tab.Screenshot("portal-unschedulable")
	if !strings.Contains(portal, "Insufficient memory") || !strings.Contains(portal, node.Name) {
		t.Errorf("the portal says %q, want the node %s and the scheduler's reason", portal, node.Name)
	}

	admin := b.Tab(t)
	row := fmt.Sprintf(`tr[data-session=%q]`, s.ID)
	admin.Do(time.Minute, chromedp.Navigate(url+"/portal/admin.html"), chromedp.WaitVisible(chromedp.CSS("#signin")))
	admin.Do(time.Minute,
		chromedp.SetValue(chromedp.CSS("#token"), d.Token("ops", "admin")),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS(row)))
	console := text(t, admin, row)
	admin.Screenshot("admin-unschedulable")
	if !strings.Contains(console, "cannot be placed") || !strings.Contains(console, "Insufficient memory") {
		t.Errorf("the admin console's row says %q, want the node cannot be placed and why", console)
	}
	t.Logf("portal: %q; admin console: %q", portal, console)

	if r := d.Close("uma"); r.Status != http.StatusOK {
		t.Fatalf("close uma = %d %s", r.Status, r.Body)
	}
	d.WaitGone(s.ID)
}

// text is the text of the first element sel matches on tab.
func text(t *testing.T, tab *browser.Tab, sel string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab.Ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("reading %s: %v", sel, err)
	}
	return s
}
