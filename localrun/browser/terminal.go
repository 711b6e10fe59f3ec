package browser

import (
	"context"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"labkeep/localrun/poll"
)

// TerminalView is what labkeep's web terminal page (/portal/terminal)
// shows: its status line, the text xterm.js has drawn (its DOM renderer's
// rows) and the page's path and query.
type TerminalView struct {
	Status string `json:"status"`
	Rows   string `json:"rows"`
	URL    string `json:"url"`
}

const readTerminal = `(() => ({
  status: document.getElementById("terminal-status").textContent,
  rows: [...document.querySelectorAll(".xterm-rows > div")].map((r) => r.textContent).join("\n"),
  url: window.location.pathname + window.location.search,
}))()`

// TypeKeys types s into the focused element as a keyboard does: a key
// down (carrying the text) and a key up per key. chromedp.KeyEvent also
// sends a separate char event, which xterm.js, reading the key press the
// key down makes, would type a second time.
func TypeKeys(s string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for _, r := range s {
			for _, k := range kb.Encode(r) {
				if k.Type == kb.KeyChar {
					continue
				}
				if _, err := cdp.Call(ctx, t, input.DispatchKeyEvent, *k); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// WaitTerminal polls the terminal page on tab until cond holds and returns
// what it showed then; after timeout (a bound on a hang) it fails the
// test with a screenshot and the last view.
func (tab *Tab) WaitTerminal(timeout time.Duration, what string, cond func(TerminalView) bool) TerminalView {
	tab.t.Helper()
	var last TerminalView
	var err error
	wait, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if poll.Until(wait, func() (bool, string) {
		ctx, cancel := context.WithTimeout(tab.Ctx, 10*time.Second)
		defer cancel()
		var v TerminalView
		if v, err = chromedp.Run(ctx, chromedp.Evaluate[TerminalView](readTerminal)); err != nil {
			return false, err.Error()
		}
		last = v
		return cond(v), what
	}) != nil {
		tab.Screenshot("timeout")
		tab.t.Fatalf("the terminal page never showed %s; last: %+v (%v)", what, last, err)
	}
	return last
}
