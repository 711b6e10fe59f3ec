package portal_test

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
	"labkeep/shared/session"
)

// queueState is the page's place in line, read from its DOM.
type queueState struct {
	Shown      bool   `json:"shown"`
	Position   string `json:"position"`
	ETA        string `json:"eta"`
	ETALatest  string `json:"etaLatest"`
	ETAText    string `json:"etaText"`
	ServerTime string `json:"serverTime"`
	Offer      bool   `json:"offer"`
	Key        bool   `json:"key"`
	// ID is the session the page shows (the entry's id while queued).
	ID string `json:"id"`
}

const readQueue = `(() => {
  const $ = (id) => document.getElementById(id);
  const q = $("queue");
  return {
    shown: !q.hidden, position: q.dataset.position || "", eta: q.dataset.eta || "", etaLatest: q.dataset.etaLatest || "",
    etaText: $("queue-eta").textContent, serverTime: q.dataset.serverTime || "",
    offer: !$("wait-offer").hidden, key: !$("key").hidden, id: $("session").dataset.id || "",
  };
})()`

// queue reads the page's place in line now.
func (s *student) queue() queueState {
	s.t.Helper()
	return evaluate[queueState](s, readQueue)
}

// waitQueue polls the page's place in line until cond holds (timeout: a
// bound on a hang).
func (s *student) waitQueue(what string, timeout time.Duration, cond func(queueState) bool) queueState {
	s.t.Helper()
	var q queueState
	stacktest.Eventually(s.t, timeout, func() (bool, string) {
		q = s.queue()
		return cond(q), fmt.Sprintf("the page never showed %s; last: %+v", what, q)
	})
	return q
}

// waitText is the page's wording of a wait of secs seconds: whole
// minutes rounded up (at least 1), hours beyond one.
func waitText(secs int64) string {
	mins := max(1, (secs+59)/60)
	if mins < 60 {
		return fmt.Sprintf("%d min", mins)
	}
	if mins%60 == 0 {
		return fmt.Sprintf("%d h", mins/60)
	}
	return fmt.Sprintf("%d h %d min", mins/60, mins%60)
}

// inLine reports whether student has an entry in the line, read from the
// database (a getSession would itself keep the place).
func inLine(d *stacktest.Deployment, student string) bool {
	return d.Count(`SELECT count(*) FROM waitlist WHERE student = $1`, student) == 1
}

// A full lab offers the line: the student who takes it sees their place
// and the server's ETA, keeps the place only because the page keeps
// asking (the functions' clock moves past the idle time in steps, the
// page's polls in between), and the page moves on to the lab by itself
// when the running student closes. Another student leaves the line from
// the page. VM labs on virtsim, one VM for everyone.
func TestPageWaitsInLine(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 1})
	ann := d.Opened("ann", "linux-vm")
	b := browser.Start(t, browser.Isolated)
	bob := visit(t, b, d, "bob")

	// Open refuses (the lab is full) and offers the line.
	bob.openLab("linux-vm")
	bob.waitPage("no capacity", time.Minute, func(p pageState) bool { return p.MessageCode == "no_capacity" })
	if q := bob.waitQueue("the offer to wait", 10*time.Second, func(q queueState) bool { return q.Offer }); q.Shown {
		t.Errorf("a place shown before joining: %+v", q)
	}
	bob.tab.Screenshot("wait-offer")
	bob.click("#wait")
	q := bob.waitQueue("place 1", time.Minute, func(q queueState) bool { return q.Shown && q.Position == "1" })
	bob.tab.Screenshot("queued")
	p := bob.state()
	if p.Status != "queued" || p.Labs || !q.Key {
		t.Errorf("in line: status %q, lab list shown %v, the generated key shown %v; want queued, no list, the key", p.Status, p.Labs, q.Key)
	}
	api := bob.get()
	if api.Status != "queued" || api.QueuePosition == nil || *api.QueuePosition != 1 || api.ID != q.ID {
		t.Fatalf("server: %s %s, place %v; the page shows %s", api.ID, api.Status, api.QueuePosition, q.ID)
	}
	queuedID := q.ID
	eta, _ := strconv.ParseInt(q.ETA, 10, 64)
	latest, _ := strconv.ParseInt(q.ETALatest, 10, 64)
	// The page's figures are the server's, a poll apart.
	if *api.ETASeconds > eta || *api.ETASeconds < eta-10 || *api.ETALatestSeconds > latest || *api.ETALatestSeconds < latest-10 || latest <= 0 {
		t.Errorf("page ETA %s s / latest %s s, server %d / %d s", q.ETA, q.ETALatest, *api.ETASeconds, *api.ETALatestSeconds)
	}
	if want := "Your lab starts likely in ~" + waitText(eta) + ", at the latest in " + waitText(latest) + "."; q.ETAText != want {
		t.Errorf("ETA text %q, want %q", q.ETAText, want)
	}
	t.Logf("bob in line: %q (server: likely %d s, latest %d s)", q.ETAText, *api.ETASeconds, *api.ETALatestSeconds)

	// Past the idle time by the functions' clock, in steps the page's
	// polls fall between: the place is kept.
	idle := d.App.Config.Limits.QueueIdle
	step := idle / 3
	for moved := time.Duration(0); moved <= idle; moved += step {
		d.Clock.Advance(step)
		after := d.Clock.Now()
		bob.waitQueue("a poll after the clock moved", time.Minute, func(q queueState) bool {
			at, err := time.Parse(time.RFC3339Nano, q.ServerTime)
			return err == nil && !at.Before(after)
		})
		if !inLine(d, "bob") {
			t.Fatalf("bob lost his place %s after joining, with the page polling", moved+step)
		}
	}
	if q = bob.queue(); !q.Shown || q.Position != "1" {
		t.Errorf("after %s: the page shows %+v", idle+step, q)
	}

	// cid joins behind bob from the page, then leaves the line (a subtest:
	// its own screenshots).
	t.Run("another student leaves the line", func(t *testing.T) {
		cid := visit(t, b, d, "cid")
		cid.openLab("linux-vm")
		cid.waitQueue("the offer to wait", time.Minute, func(q queueState) bool { return q.Offer })
		cid.click("#wait")
		cid.waitQueue("place 2", time.Minute, func(q queueState) bool { return q.Shown && q.Position == "2" })
		cid.tab.Screenshot("queued-second")
		cid.click("#leave")
		p := cid.waitPage("the line left", time.Minute, func(p pageState) bool { return p.MessageCode == "left" })
		cid.tab.Screenshot("left")
		if !p.Labs || p.Session || inLine(d, "cid") {
			t.Errorf("after leaving: lab list %v, session shown %v, cid in line %v", p.Labs, p.Session, inLine(d, "cid"))
		}
		// Her latest session is the open refused before she joined.
		if r := d.Do("GET", "/getSession", d.Token("cid", "student"), "", ""); r.Status != http.StatusOK || r.Session.Status == "queued" {
			t.Errorf("cid's getSession after leaving = %d %s", r.Status, r.Body)
		}
	})

	// ann closes: bob's page, still polling, moves on to his lab.
	if r := d.Close("ann"); r.Status != http.StatusOK {
		t.Fatalf("ann's close = %d %s", r.Status, r.Body)
	}
	p = bob.waitPage("the lab running", 2*time.Minute, func(p pageState) bool { return p.Status == "running" })
	bob.tab.Screenshot("served-running")
	api = bob.get()
	if q = bob.queue(); api.ID != queuedID || q.ID != queuedID || p.Labs || q.Shown || len(p.SSH) != 1 {
		t.Errorf("served: server %s %s, queued as %s; page %s, lab list %v, place shown %v, ssh %q", api.ID, api.Status, queuedID, q.ID, p.Labs, q.Shown, p.SSH)
	}
	if p.PrivateKey == "" {
		t.Error("the key generated when bob joined is no longer shown once his lab runs")
	}
	if got := d.Session(ann.ID).End.Kind; got != session.EndClosed {
		t.Errorf("ann's session ended %s", got)
	}
	if r := d.Close("bob"); r.Status != http.StatusOK {
		t.Errorf("bob's close = %d %s", r.Status, r.Body)
	}
	d.WaitGone(api.ID)
}
