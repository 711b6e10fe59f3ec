package podlab_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
)

// A real workspace's guardian delivers its alerts to labkeep. The workspace
// Pod the builder made carries the session's own webhook credentials (its
// id and token, as HTTP Basic user info of GUARDIAN_WEBHOOK_URL) in
// guardian's environment, which the workspace's root cannot read. A memory
// hog inside the workspace makes guardian kill it and raise memory-kill;
// guardian posts it to labkeep's POST /guardianAlert (served alone on a
// listener at the host's address on the node's link, which the Pod reaches,
// as make run serves it), labkeep stores it with the session, and the admin
// console shows it in a real Chromium.
func TestGuardianAlertReachesTheAdminConsole(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{})
	route, err := url.Parse(d.App.Config.Kube.GuardianWebhookURL)
	if err != nil || route.Hostname() != st.Node.HostIP {
		t.Fatalf("the deployment's guardian webhook is %q (%v): want a listener on the host's address on the node's link %s", d.App.Config.Kube.GuardianWebhookURL, err, st.Node.HostIP)
	}

	workload := buildWorkload(t)
	s := openLab(t, d, "grace", "shell", nil)
	s.waitRunning(3 * time.Minute)
	id := s.opened.ID
	pod := s.pod()

	var hook string
	for _, e := range pod.Spec.InitContainers[0].Env {
		if e.Name == "GUARDIAN_WEBHOOK_URL" {
			hook = e.Value
		}
	}
	u, err := url.Parse(hook)
	if err != nil {
		t.Fatalf("GUARDIAN_WEBHOOK_URL %q: %v", hook, err)
	}
	token, _ := u.User.Password()
	if u.User.Username() != id || !d.App.Config.AlertKey().Verify(id, token) || u.Host != route.Host || u.Path != "/guardianAlert" {
		t.Fatalf("guardian's GUARDIAN_WEBHOOK_URL is %q: want labkeep's endpoint with session %s's own credentials", hook, id)
	}

	// The workspace's root sees guardian's process (one PID namespace)
	// but may not read its environment, where the token is.
	out, err := s.run(`cat /proc/$(pgrep -o -x guardian)/environ`, nil)
	if err == nil || !strings.Contains(out, "Permission denied") || strings.Contains(out, token) {
		t.Errorf("the workspace's root reading guardian's environment: err %v, output %q; want Permission denied", err, out)
	}

	// Three processes growing towards 400 MiB each, 1.2 GiB together in a
	// 1 GiB workspace: guardian kills one and raises memory-kill.
	s.upload(workload, "/root/workload")
	s.mustRun("for i in 1 2 3; do setsid /root/workload hog -mb 400 -step 8 -every 20ms </dev/null >/dev/null 2>&1 & done")
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		n := d.Count(`SELECT count(*) FROM guardian_alerts WHERE session_id = $1 AND kind = 'memory-kill'`, id)
		return n >= 1, fmt.Sprintf("%d memory-kill alerts stored for the session; guardian has raised %v", n, kinds(alerts(t, pod)))
	})
	_, _ = s.run("pkill -f /root/workload", nil)
	if n := d.Count(`SELECT count(*) FROM guardian_alerts WHERE session_id <> $1`, id); n != 0 {
		t.Errorf("%d alerts stored under another session", n)
	}

	// The admin console shows it, with the student.
	b := browser.Start(t, browser.Isolated)
	tab := b.Tab(t)
	tab.Do(time.Minute, chromedp.Navigate(b.Reach(t, d.Server.URL)+"/portal/admin.html"), chromedp.WaitVisible(chromedp.CSS("#signin")))
	tab.Do(30*time.Second,
		chromedp.SetValue(chromedp.CSS("#token"), d.Token("ops", "admin")),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS("#console")))
	read := fmt.Sprintf(`(() => { const tr = document.querySelector('#alerts tr[data-session=%q][data-kind="memory-kill"]');
  return tr ? [...tr.cells].map((c) => c.textContent) : []; })()`, id)
	var cells []string
	stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(tab.Ctx, 10*time.Second)
		defer cancel()
		cells, err = chromedp.Run(ctx, chromedp.Evaluate[[]string](read))
		return err == nil && len(cells) == 8, fmt.Sprintf("alert row %v (%v)", cells, err)
	})
	if cells[1] != "grace" || cells[3] != "critical" {
		t.Errorf("the console's alert row reads %q: want student grace and memory-kill's severity, critical", cells)
	}
	t.Logf("the console shows guardian's alert: %q", cells)
	tab.Screenshot("guardian-alert")
}
