package portal_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
	"labkeep/shared/lifetime"
)

// A student runs the shell lab (a workspace Pod on the real node) from the
// page alone: sign in, choose, open, watch it provision, log in over SSH
// with the key and command the page shows, follow the countdown (to the
// server's second), get the 10-minute warning, extend, reach the cap,
// get the 5-minute warning, close after confirming.
func TestStudentRunsAPodLabInTheBrowser(t *testing.T) {
	// 12 minutes, at most 20: the 10-minute warning is 2 minutes away,
	// and two extensions reach the cap.
	d := stacktest.Deploy(t, st, stacktest.Options{Lifetime: 12 * time.Minute, MaxLifetime: 20 * time.Minute})
	s := visit(t, browser.Start(t, browser.Isolated), d, "ann")

	p := s.waitPage("the lab list", 30*time.Second, func(p pageState) bool { return p.Labs && !p.Session })
	s.tab.Screenshot("labs")
	s.tab.Do(30*time.Second, chromedp.Click(chromedp.CSS(`input[name="lab"][value="shell"]`)))
	s.click("#open")

	// Provisioning, phase by phase, until SSH is ready.
	var seen []string
	p = s.waitPage("the lab ready", 4*time.Minute, func(p pageState) bool {
		if p.Session && (len(seen) == 0 || seen[len(seen)-1] != p.Phase) {
			seen = append(seen, p.Phase)
			if p.Phase != "ready" {
				s.tab.Screenshot("phase-" + p.Phase)
			}
		}
		return p.Status == "running"
	})
	s.tab.Screenshot("ready")
	t.Logf("phases the page showed: %v", seen)
	order := []string{"scheduled", "booting", "ready"}
	if seen[0] == "ready" || seen[len(seen)-1] != "ready" || !slices.IsSortedFunc(seen, func(a, b string) int {
		return slices.Index(order, a) - slices.Index(order, b)
	}) {
		t.Errorf("phases shown %v: want them in the order %v, from before ready to ready", seen, order)
	}
	api := s.get()
	if len(p.Nodes) != 1 || p.Nodes[0].Phase != "ready" || p.Nodes[0].Name != api.Nodes[0].Name {
		t.Errorf("machines on the page %+v, server %+v", p.Nodes, api.Nodes)
	}

	// The SSH command, private key and known_hosts line the page shows
	// log the student in.
	n := api.Nodes[0].SSH
	wantCmd := fmt.Sprintf("ssh -i labkeep-key -o UserKnownHostsFile=known_hosts -o StrictHostKeyChecking=yes %s@%s -p %d", n.User, n.Host, n.Port)
	if len(p.SSH) != 1 || p.SSH[0] != wantCmd {
		t.Errorf("ssh command on the page %q, want %q", p.SSH, wantCmd)
	}
	if strings.TrimSpace(p.KnownHosts) != n.KnownHosts {
		t.Errorf("known_hosts on the page %q, server %q", p.KnownHosts, n.KnownHosts)
	}
	loginWith(t, p.PrivateKey, p.KnownHosts, api.StudentKey, net.JoinHostPort(n.Host, strconv.Itoa(n.Port)), n.User)

	// Its Copy button puts exactly that command on the clipboard.
	if got := s.copied("ssh-0"); got != wantCmd {
		t.Errorf("copied %q, want %q", got, wantCmd)
	}

	// The countdown is the server's.
	_, api = s.countdownAgrees()

	// Later by the server's clock (the browser's does not move): 9½
	// minutes left, the warning shows.
	d.Clock.Advance(time.Duration(api.RemainingSeconds)*time.Second - 570*time.Second)
	p = s.waitPage("the 10-minute warning", time.Minute, func(p pageState) bool { return p.Warning == "600" })
	s.tab.Screenshot("warning-10min")
	if _, api = s.countdownAgrees(); !due(api, 600) || due(api, 300) {
		t.Errorf("server warnings %+v: want the 10-minute one due, not the 5-minute one", api.Warnings)
	}
	if !strings.Contains(p.WarningText, "10 minutes") || !strings.Contains(p.WarningText, "Extend") {
		t.Errorf("warning text %q", p.WarningText)
	}

	// Extend: the page shows the new expiry, and the warning goes.
	s.click("#extend")
	p = s.waitPage("the extension", time.Minute, func(p pageState) bool { return p.MessageCode == "extended" })
	s.tab.Screenshot("extended")
	api = s.get()
	if got, err := time.Parse(time.RFC3339Nano, p.ExpiresAt); err != nil || !got.Equal(api.ExpiresAt) {
		t.Errorf("page shows expiry %q, server %s", p.ExpiresAt, api.ExpiresAt)
	}
	if p.Warning != "" {
		t.Errorf("warning %q still shown with %s left", p.WarningText, p.Remaining)
	}
	_, api = s.countdownAgrees()

	// Eleven minutes before the cap, extending reaches it: Extend is
	// disabled, saying why and when the lab ends.
	d.Clock.Advance(api.MaxExpiresAt.Add(-11 * time.Minute).Sub(api.ServerTime))
	s.click("#extend")
	p = s.waitPage("Extend disabled at the cap", time.Minute, func(p pageState) bool { return p.Extend.Disabled && p.Extend.Note != "" })
	s.tab.Screenshot("at-cap")
	api = s.get()
	if api.Extendable || api.ExtendRefusal != lifetime.ErrAtCap.Error() || !api.ExpiresAt.Equal(api.MaxExpiresAt) {
		t.Errorf("server: extendable %v, refusal %q, expires %s, cap %s", api.Extendable, api.ExtendRefusal, api.ExpiresAt, api.MaxExpiresAt)
	}
	if !strings.Contains(p.Extend.Note, lifetime.ErrAtCap.Error()) || !strings.Contains(p.Extend.Note, "ends at") {
		t.Errorf("extend note %q: want the server's reason and the end", p.Extend.Note)
	}

	// 4½ minutes left: the 5-minute warning, saying it cannot be
	// extended.
	d.Clock.Advance(time.Duration(api.RemainingSeconds)*time.Second - 270*time.Second)
	p = s.waitPage("the 5-minute warning", time.Minute, func(p pageState) bool { return p.Warning == "300" })
	s.tab.Screenshot("warning-5min")
	if _, api = s.countdownAgrees(); !due(api, 300) {
		t.Errorf("server warnings %+v: want the 5-minute one due", api.Warnings)
	}
	if !strings.Contains(p.WarningText, "cannot be extended") {
		t.Errorf("warning text %q", p.WarningText)
	}

	// Close asks first; keeping it changes nothing, confirming closes.
	s.click("#close")
	s.waitPage("the close confirmation", 10*time.Second, func(p pageState) bool { return p.CloseConfirm })
	s.tab.Screenshot("close-confirm")
	s.click("#close-no")
	s.waitPage("the confirmation gone", 10*time.Second, func(p pageState) bool { return !p.CloseConfirm })
	if api = s.get(); api.Status != "running" {
		t.Fatalf("after keeping the lab it is %s", api.Status)
	}
	s.click("#close")
	s.click("#close-yes")
	p = s.waitPage("the lab closed", time.Minute, func(p pageState) bool { return p.Status == "closed" })
	s.tab.Screenshot("closed")
	api = s.get()
	if api.Status != "closed" || p.Message != api.FailureReason || !p.Labs {
		t.Errorf("after close: server %s %q; page message %q, lab list shown %v", api.Status, api.FailureReason, p.Message, p.Labs)
	}
	d.WaitGone(api.ID)
}

// due reports whether the server lists the warning before seconds as due.
func due(s stacktest.SessionView, before int64) bool {
	for _, w := range s.Warnings {
		if w.BeforeSeconds == before {
			return w.Due
		}
	}
	return false
}

// loginWith logs in over SSH at addr as user with the private key and
// known_hosts line as the page shows them (strict host-key checking),
// after checking the key is the session's.
func loginWith(t *testing.T, privateKey, knownHostsLine, studentKey, addr, user string) {
	t.Helper()
	signer, hostKey := pageSSH(t, privateKey, knownHostsLine)
	if got := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))); got != strings.TrimSpace(studentKey) {
		t.Fatalf("the page's key is %s, the session's %s", got, studentKey)
	}
	cfg := &ssh.ClientConfig{User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hostKey, Timeout: 10 * time.Second}
	var out []byte
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		c, err := ssh.Dial("tcp", addr, cfg)
		if err != nil {
			return false, err.Error()
		}
		defer c.Close()
		sess, err := c.NewSession()
		if err != nil {
			return false, err.Error()
		}
		defer sess.Close()
		out, err = sess.Output("id -un")
		return err == nil, fmt.Sprintf("id -un: %v %s", err, out)
	})
	if strings.TrimSpace(string(out)) != "root" {
		t.Errorf("logged in as %q, want root", out)
	}
}

// pageSSH is the private key and the known_hosts line the page shows, as
// an SSH client takes them (strict host-key checking).
func pageSSH(t *testing.T, privateKey, knownHostsLine string) (ssh.Signer, ssh.HostKeyCallback) {
	t.Helper()
	signer, err := ssh.ParsePrivateKey([]byte(privateKey))
	if err != nil {
		t.Fatalf("the private key on the page does not parse: %v", err)
	}
	file := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(file, []byte(knownHostsLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hostKey, err := knownhosts.New(file)
	if err != nil {
		t.Fatal(err)
	}
	return signer, hostKey
}

// copied presses the Copy button of the element id, with the clipboard
// allowed for the page's origin, and returns what the clipboard holds.
func (s *student) copied(id string) string {
	s.t.Helper()
	for _, name := range []string{"clipboard-read", "clipboard-write"} {
		_, err := chromedp.CallBrowser(s.tab.Ctx, cdpbrowser.SetPermission, cdpbrowser.SetPermissionParams{
			Permission: &cdpbrowser.PermissionDescriptor{Name: name}, Setting: cdpbrowser.PermissionSettingGranted, Origin: s.d.Server.URL,
		})
		if err != nil {
			s.t.Fatalf("allowing %s: %v", name, err)
		}
	}
	s.tab.Do(30*time.Second, chromedp.Evaluate[chromedp.Void](`window.focus()`))
	s.click(`button.copy[data-copy="` + id + `"]`)
	ctx, cancel := context.WithTimeout(s.tab.Ctx, 10*time.Second)
	defer cancel()
	// The button says so once the clipboard has taken the text.
	stacktest.Eventually(s.t, 10*time.Second, func() (bool, string) {
		label, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`button.copy[data-copy="`+id+`"]`)))
		return err == nil && label == "Copied", fmt.Sprintf("Copy button reads %q (%v), want Copied", label, err)
	})
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise))
	if err != nil {
		s.t.Fatalf("reading the clipboard: %v", err)
	}
	return text
}
