package portal_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
)

// homeLabs is the shell lab keeping the student's home.
const homeLabs = `labs:
- name: shell
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  nodes: [{role: workspace, cpu: 500m, memory: 512Mi}]
  home: {size: 256Mi, mountPath: /home/student}
`

// A student whose lab keeps a home sees, in headless Chromium, where it
// is and that it stays (the close confirmation says so too), and saves it
// with "Download your home": the archive's files are what they wrote.
// Once the lab is closed the homes list saves it too, with no lab
// running. Another student's token gets 403 for it.
func TestStudentDownloadsTheirHome(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: homeLabs})
	s := visit(t, browser.Start(t, browser.Isolated), d, "ann")
	s.waitPage("the lab list", 30*time.Second, func(p pageState) bool { return p.Labs && !p.Session })
	s.tab.Do(30*time.Second, chromedp.Click(chromedp.CSS(`input[name="lab"][value="shell"]`)))
	s.click("#open")
	p := s.waitPage("the lab ready", 4*time.Minute, func(p pageState) bool { return p.Status == "running" })
	api := s.get()
	n := api.Nodes[0].SSH

	written := map[string]string{"notes.txt": "kept between labs\n", "src/main.c": "int main(void) { return 0; }\n"}
	run(t, p.PrivateKey, p.KnownHosts, net.JoinHostPort(n.Host, strconv.Itoa(n.Port)), n.User,
		`mkdir -p /home/student/src && printf 'kept between labs\n' > /home/student/notes.txt && printf 'int main(void) { return 0; }\n' > /home/student/src/main.c`)

	where := evaluate[string](s, `document.getElementById("home-where").textContent`)
	if !strings.Contains(where, "/home/student") || !strings.Contains(where, "stay") {
		t.Errorf("the page says of the home: %q", where)
	}
	s.click("#close")
	closing := evaluate[string](s, `document.getElementById("close-what").textContent`)
	if !strings.Contains(closing, "except your home /home/student") {
		t.Errorf("the close confirmation says %q; want it to name the home that stays", closing)
	}
	s.click("#close-no")
	s.tab.Screenshot("home")

	if diff := cmp.Diff(written, stacktest.Untar(t, savedArchive(t, s, "#home-download"))); diff != "" {
		t.Errorf("the downloaded home (-written +downloaded):\n%s", diff)
	}
	s.tab.Screenshot("home-downloaded")

	// With the lab closed no session holds the home: the list offers a
	// download of its own, which labkeep reads without a lab.
	s.click("#close")
	s.click("#close-yes")
	s.waitPage("the lab closed", time.Minute, func(p pageState) bool { return p.Status == "closed" })
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		return evaluate[int](s, `document.querySelectorAll("#home-list button.home-save").length`) == 1,
			"the homes list reads " + evaluate[string](s, `document.getElementById("home-list").textContent`)
	})
	s.tab.Screenshot("home-unused")
	if diff := cmp.Diff(written, stacktest.Untar(t, savedArchive(t, s, "#home-list button.home-save"))); diff != "" {
		t.Errorf("the home downloaded with no lab (-written +downloaded):\n%s", diff)
	}
	home := kube.HomeName(d.Env, "ann", "")
	if r := d.Do("GET", "/homeArchive?name="+home, d.Token("bob", "student"), "", ""); r.Status != 403 {
		t.Errorf("bob downloading ann's home: %d %s; want 403", r.Status, r.Body)
	}
}

// savedArchive clicks the button button, waits for the page to say it
// saved an archive and returns the file Chromium saved, read from a
// download directory of its own.
func savedArchive(t *testing.T, s *student, button string) []byte {
	t.Helper()
	dir := t.TempDir()
	if _, err := chromedp.CallBrowser(s.tab.Ctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
		Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir}); err != nil {
		t.Fatal(err)
	}
	evaluate[string](s, `document.getElementById("home-note").textContent = ""`)
	s.click(button)
	var saved string
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		note := evaluate[string](s, `document.getElementById("home-note").textContent`)
		if !strings.HasPrefix(note, "Saved ") {
			return false, "the page says " + note
		}
		var size int64
		fmt.Sscanf(note[strings.Index(note, "(")+1:], "%d", &size)
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if info, err := e.Info(); err == nil && info.Size() == size && size > 0 {
				saved = filepath.Join(dir, e.Name())
				return true, ""
			}
		}
		return false, fmt.Sprintf("the page says %q; the download directory holds %d files", note, len(entries))
	})
	b, err := os.ReadFile(saved)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// run runs cmd over SSH as the page's key and known_hosts line allow.
func run(t *testing.T, privateKey, knownHostsLine, addr, user, cmd string) {
	t.Helper()
	signer, hostKey := pageSSH(t, privateKey, knownHostsLine)
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		out, err := stacktest.SSHRun(addr, user, signer, hostKey, cmd)
		return err == nil, fmt.Sprintf("%s: %v %s", cmd, err, out)
	})
}
