// Package browser runs a real headless Chromium for tests of labkeep's web
// pages (Debian's chromium package; localrun/setup.sh installs it), driven
// over the DevTools protocol with chromedp.
//
// Start launches one browser for a test: headless, with --no-sandbox
// --disable-gpu --disable-background-networking --disable-component-update
// --no-first-run and a fresh --user-data-dir of the test's own, so nothing
// carries over between tests and the browser never phones home. Tab opens a
// page context on it; everything the page writes to the console is kept,
// and an uncaught exception or a browser security entry (a Content
// Security Policy violation) fails the test when the tab ends, so a page
// that only works with inline script or style cannot pass.
//
// Start(t, Isolated) runs the browser in a network namespace of its own
// that reaches only the addresses given to Reach (forwarded to the same
// addresses outside): Chromium fails its requests in flight whenever the
// machine's network changes, which a local node does at every Pod it
// starts or stops, so page tests beside a node use it.
//
// Screenshot saves a PNG of the page as a test artifact under
// ArtifactDir: $LABKEEP_ARTIFACTS if set, else test/artifacts/ at the
// module root (ignored by git), one directory per test; the path is
// logged. A test is skipped only when no Chromium can be found, saying so.
package browser

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// ExecEnv names a Chromium binary to use instead of the first of Names
// found on PATH.
const ExecEnv = "LABKEEP_CHROMIUM"

// ArtifactsEnv names the directory test artifacts (screenshots) go to.
const ArtifactsEnv = "LABKEEP_ARTIFACTS"

// Names are the Chromium executables looked for on PATH, in order.
var Names = []string{"chromium", "chromium-browser", "google-chrome", "headless_shell"}

// ErrNotFound is returned by Find when no Chromium is installed.
var ErrNotFound = errors.New("no Chromium found")

// Find returns the Chromium to run: $LABKEEP_CHROMIUM, or the first of
// Names on PATH.
func Find() (string, error) {
	if p := os.Getenv(ExecEnv); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", ExecEnv, p, err)
		}
		return p, nil
	}
	for _, n := range Names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: looked for $%s and %s on PATH (install Debian's chromium: localrun/setup.sh does)", ErrNotFound, ExecEnv, strings.Join(Names, ", "))
}

// Browser is one running headless Chromium.
type Browser struct {
	ctx   context.Context
	quiet *quietNet
}

// Option changes how Start runs the browser.
type Option func(*options)

type options struct{ isolated bool }

// Isolated runs the browser in a network namespace of its own, which
// reaches only the addresses passed to Reach: the machine's network
// changing (a local node starting or stopping a Pod) then never fails its
// requests in flight (ERR_NETWORK_CHANGED), as it does in the machine's
// namespace.
func Isolated(o *options) { o.isolated = true }

// Start launches Chromium for t (skipping t, with the reason, only if none
// is installed) and stops it when t ends.
func Start(t testing.TB, opts ...Option) *Browser {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	path, err := Find()
	if errors.Is(err, ErrNotFound) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	b := &Browser{}
	exe := path
	if o.isolated {
		if b.quiet, exe, err = isolate(t.TempDir(), path); err != nil {
			t.Fatalf("isolating the browser's network: %v", err)
		}
		t.Cleanup(b.quiet.close)
	}
	flags := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("password-store", "basic"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 900),
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), flags...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	where := "the machine's network namespace"
	if b.quiet != nil {
		where = "a network namespace of its own"
	}
	t.Logf("browser: %s (headless, in %s)", path, where)
	b.ctx = ctx
	return b
}

// Reach lets an Isolated browser reach the host and port of rawURL (the
// same address outside); without Isolated every address is reachable
// and Reach does nothing. It returns rawURL.
func (b *Browser) Reach(t testing.TB, rawURL string) string {
	t.Helper()
	if b.quiet == nil {
		return rawURL
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.quiet.forward(u.Host); err != nil {
		t.Fatal(err)
	}
	return rawURL
}

// Tab is one page of the browser, with what it wrote to its console.
type Tab struct {
	// Ctx runs chromedp actions on the page.
	Ctx  context.Context
	t    testing.TB
	mu   sync.Mutex
	msgs []chromedp.ConsoleMessage
	shot int
}

// Tab opens a new page, closed when t ends. When it closes, an uncaught
// exception or a security entry (a Content Security Policy violation) in
// its console fails t.
func (b *Browser) Tab(t testing.TB) *Tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx)
	tab := &Tab{Ctx: ctx, t: t}
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		t.Fatalf("opening a tab: %v", err)
	}
	msgs := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			tab.mu.Lock()
			tab.msgs = append(tab.msgs, m)
			tab.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		for _, m := range tab.Console() {
			t.Logf("console %s", m)
			if m.IsException() || m.Source == "security" {
				t.Errorf("the page failed: %s (%s:%d)", m, m.URL, m.Line)
			}
		}
	})
	return tab
}

// Console is what the page wrote to its console so far.
func (tab *Tab) Console() []chromedp.ConsoleMessage {
	tab.mu.Lock()
	defer tab.mu.Unlock()
	return append([]chromedp.ConsoleMessage(nil), tab.msgs...)
}

// Do runs actions on the page, failing the test (with a screenshot) if one
// fails or timeout passes first.
func (tab *Tab) Do(timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	tab.t.Helper()
	ctx, cancel := context.WithTimeout(tab.Ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tab.Screenshot("failed")
		tab.t.Fatal(err)
	}
}

// Screenshot saves a PNG of the whole page as ArtifactDir/NN-name.png
// (NN counts the tab's screenshots, so they sort in the order taken) and
// logs its path; a failure to take it is logged, not fatal.
func (tab *Tab) Screenshot(name string) string {
	tab.t.Helper()
	ctx, cancel := context.WithTimeout(tab.Ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		tab.t.Logf("screenshot %s: %v", name, err)
		return ""
	}
	tab.shot++
	path := filepath.Join(ArtifactDir(tab.t), fmt.Sprintf("%02d-%s.png", tab.shot, name))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tab.t.Logf("screenshot %s: %v", name, err)
		return ""
	}
	tab.t.Logf("screenshot: %s", path)
	return path
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// ArtifactDir is the directory t's artifacts go to, created if missing:
// $LABKEEP_ARTIFACTS/<test name>, or test/artifacts/<test name> at the
// module root (ignored by git).
func ArtifactDir(t testing.TB) string {
	t.Helper()
	root := os.Getenv(ArtifactsEnv)
	if root == "" {
		mod, err := moduleRoot()
		if err != nil {
			t.Fatal(err)
		}
		root = filepath.Join(mod, "test", "artifacts")
	}
	dir := filepath.Join(root, unsafeName.ReplaceAllString(t.Name(), "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// moduleRoot is the nearest directory above the working directory (a
// test's package directory) holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s: set %s", dir, ArtifactsEnv)
		}
	}
}
