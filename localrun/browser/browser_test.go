package browser

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"labkeep/localrun/poll"
)

// page serves one HTML page under a strict Content-Security-Policy, with
// an external script that writes into it and an inline one the policy
// must block.
func page(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><title>t</title><p id="out">static</p>` +
			`<script src="/ok.js"></script><script>document.getElementById("out").textContent = "inline ran"</script>`))
	})
	mux.HandleFunc("/plain", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><title>t</title><p id="out">static</p><script src="/ok.js"></script>`))
	})
	mux.HandleFunc("/ok.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		_, _ = w.Write([]byte(`document.getElementById("out").textContent = "external ran";`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestTabRunsPagesAndSavesScreenshots(t *testing.T) {
	srv := page(t)
	tab := Start(t).Tab(t)
	tab.Do(30*time.Second, chromedp.Navigate(srv.URL), chromedp.WaitVisible(chromedp.CSS("#out")))
	got, err := chromedp.Run(tab.Ctx, chromedp.Text(chromedp.CSS("#out")))
	if err != nil {
		t.Fatal(err)
	}
	if got != "external ran" {
		t.Errorf("#out = %q, want the external script's text (and the inline one blocked)", got)
	}
	path := tab.Screenshot("page")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), "\x89PNG") {
		t.Errorf("%s is not a PNG", path)
	}
	// The inline script's refusal is in the console as a security entry,
	// which is what fails a page test when its tab ends; it is taken out
	// here because this page breaks its policy on purpose.
	poll.Eventually(t, 10*time.Second, func() (bool, string) {
		console := tab.Console()
		return hasSecurityEntry(console), fmt.Sprintf("no security entry for the blocked inline script; console: %v", console)
	})
	tab.mu.Lock()
	tab.msgs = nil
	tab.mu.Unlock()
}

func hasSecurityEntry(msgs []chromedp.ConsoleMessage) bool {
	for _, m := range msgs {
		if m.Source == "security" {
			return true
		}
	}
	return false
}

// An isolated browser reaches what it was told to reach, as the same URL,
// and nothing else on the machine.
func TestIsolatedReachesOnlyWhatItIsGiven(t *testing.T) {
	given, other := page(t), page(t)
	b := Start(t, Isolated)
	tab := b.Tab(t)
	tab.Do(30*time.Second, chromedp.Navigate(b.Reach(t, given.URL)+"/plain"), chromedp.WaitVisible(chromedp.CSS("#out")))
	got, err := chromedp.Run(tab.Ctx, chromedp.Text(chromedp.CSS("#out")))
	if err != nil || got != "external ran" {
		t.Errorf("#out = %q (%v), want the page's script to have run", got, err)
	}
	// The other server, never given, is unreachable from inside.
	ctx, cancel := context.WithTimeout(tab.Ctx, 20*time.Second)
	defer cancel()
	err = chromedp.Do(ctx, chromedp.Navigate(other.URL+"/plain"))
	if err == nil || !strings.Contains(err.Error(), "ERR_CONNECTION_REFUSED") {
		t.Errorf("navigating to a server not given: %v, want connection refused", err)
	}
}
