package admin_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
)

// waitingState is the console's Waiting and Warm pool sections.
type waitingState struct {
	Waiting []row  `json:"waiting"`
	Total   string `json:"total"`
	Nobody  bool   `json:"nobody"`
	Pools   bool   `json:"pools"`
	PoolRow []row  `json:"poolRows"`
}

const readWaiting = `(() => {
  const $ = (id) => document.getElementById(id);
  const rows = (id) => [...$(id).tBodies[0].rows].map((tr) => ({ data: { ...tr.dataset }, cells: [...tr.cells].map((c) => c.textContent) }));
  return { waiting: rows("waiting"), total: $("waiting-total").textContent, nobody: !$("no-waiting").hidden,
    pools: !$("pools-section").hidden, poolRows: rows("pools") };
})()`

func (a admin) waiting(what string, timeout time.Duration, cond func(waitingState) bool) waitingState {
	a.t.Helper()
	var w waitingState
	stacktest.Eventually(a.t, timeout, func() (bool, string) {
		var err error
		w, err = chromedp.Run(a.tab.Ctx, chromedp.Evaluate[waitingState](readWaiting))
		return err == nil && cond(w), fmt.Sprintf("the console never showed %s; last: %+v (%v)", what, w, err)
	})
	return w
}

// statusJSON is the part of GET /adminStatus the Waiting and Warm pool
// sections show.
type statusJSON struct {
	Queues []struct {
		Lab               string `json:"lab"`
		Length            int    `json:"length"`
		OldestWaitSeconds int64  `json:"oldestWaitSeconds"`
	} `json:"queues"`
	Pools []struct {
		Lab  string `json:"lab"`
		Idle int    `json:"idle"`
	} `json:"pools"`
}

func adminStatus(t *testing.T, d *stacktest.Deployment) statusJSON {
	t.Helper()
	r := d.Do("GET", "/adminStatus", d.Token("ops", "admin"), "", "")
	var st statusJSON
	if err := json.Unmarshal(r.Body, &st); err != nil || r.Status != http.StatusOK {
		t.Fatalf("adminStatus = %d %s (%v)", r.Status, r.Body, err)
	}
	return st
}

// metric is the value of the series line (name{labels}) d's /metrics
// serves, or "" if absent.
func metric(t *testing.T, d *stacktest.Deployment, series string) string {
	t.Helper()
	for _, line := range strings.Split(d.Scrape(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// The console's Waiting section shows, per lab someone waits for, how
// many wait and the oldest wait, as adminStatus's queues say; the gauges
// on /metrics agree; the Warm pool section shows adminStatus's pools and
// is hidden when there are none. Two students wait for the one VM (on
// virtsim); the functions' clock moves on 90 s, within the idle time.
func TestConsoleShowsTheLine(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 1})
	d.Opened("s-running", "linux-vm")
	b := browser.Start(t, browser.Isolated)
	a := signIn(t, b, d)
	w := a.waiting("nobody waiting", 30*time.Second, func(w waitingState) bool { return w.Nobody })
	if len(w.Waiting) != 0 || w.Total != "" {
		t.Errorf("nobody waits, the console shows %+v", w)
	}

	for _, s := range []string{"s-first", "s-second"} {
		r := d.Do("POST", "/openSession", d.Token(s, "student"), `{"lab":"linux-vm","wait":true}`, "")
		if r.Status != http.StatusAccepted {
			t.Fatalf("%s's open with wait = %d %s", s, r.Status, r.Body)
		}
	}
	d.Clock.Advance(90 * time.Second)
	w = a.waiting("two waiting for 90 s", 30*time.Second, func(w waitingState) bool {
		if len(w.Waiting) != 1 {
			return false
		}
		n, _ := strconv.Atoi(w.Waiting[0].Data["oldest"])
		return n >= 90
	})
	a.tab.Screenshot("waiting")
	got := w.Waiting[0]
	oldest, _ := strconv.ParseInt(got.Data["oldest"], 10, 64)
	st := adminStatus(t, d)
	var vm struct {
		Length int
		Oldest int64
	}
	for _, q := range st.Queues {
		if q.Lab == "linux-vm" {
			vm.Length, vm.Oldest = q.Length, q.OldestWaitSeconds
		}
	}
	if vm.Length != 2 || vm.Oldest < oldest || vm.Oldest > oldest+30 {
		t.Errorf("adminStatus queues %+v; the console shows oldest %d s", st.Queues, oldest)
	}
	if diff := cmp.Diff([]string{"linux-vm", "2", fmt.Sprintf("%d:%02d", oldest/60, oldest%60)}, got.Cells); diff != "" {
		t.Errorf("the linux-vm row (-want +got):\n%s", diff)
	}
	if w.Total != "2 waiting" {
		t.Errorf("the section's total reads %q", w.Total)
	}
	if v := metric(t, d, `labkeep_waitlist_length{lab="linux-vm"}`); v != "2" {
		t.Errorf("labkeep_waitlist_length of linux-vm = %q, want 2", v)
	}
	if v, err := strconv.ParseFloat(metric(t, d, `labkeep_waitlist_oldest_wait_seconds{lab="linux-vm"}`), 64); err != nil || v < 90 {
		t.Errorf("labkeep_waitlist_oldest_wait_seconds of linux-vm = %v (%v), want at least 90", v, err)
	}
	if v := metric(t, d, `labkeep_waitlist_events_total{event="joined",lab="linux-vm"}`); v != "2" {
		t.Errorf("joined linux-vm = %q, want 2", v)
	}

	// The warm pool section follows adminStatus's pools.
	if w.Pools != (len(st.Pools) > 0) || len(w.PoolRow) != len(st.Pools) {
		t.Errorf("warm pool section shown %v with %d rows; adminStatus has %d pools", w.Pools, len(w.PoolRow), len(st.Pools))
	}

	// The first leaves, the second is served when the VM frees: nobody
	// waits any more.
	if r := d.Close("s-first"); r.Status != http.StatusOK {
		t.Fatalf("s-first leaving = %d %s", r.Status, r.Body)
	}
	a.waiting("one waiting", 30*time.Second, func(w waitingState) bool { return len(w.Waiting) == 1 && w.Waiting[0].Data["length"] == "1" })
	if r := d.Close("s-running"); r.Status != http.StatusOK {
		t.Fatalf("s-running's close = %d %s", r.Status, r.Body)
	}
	a.waiting("nobody waiting", 30*time.Second, func(w waitingState) bool { return w.Nobody && len(w.Waiting) == 0 })
	a.tab.Screenshot("nobody-waiting")
	for ev, want := range map[string]string{"left": "1", "served": "1"} {
		if v := metric(t, d, `labkeep_waitlist_events_total{event="`+ev+`",lab="linux-vm"}`); v != want {
			t.Errorf("%s linux-vm = %q, want %s", ev, v, want)
		}
	}
}

// The Warm pool section shows adminStatus's pools as the reaper's runs
// fill the pool (linux-vm=2 on virtsim) and a student's open claims an
// instance.
func TestConsoleShowsTheWarmPool(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 8, WarmPool: "linux-vm=2"})
	b := browser.Start(t, browser.Isolated)
	a := signIn(t, b, d)
	pool := func(w waitingState) row {
		r, _ := find(w.PoolRow, "lab", "linux-vm")
		return r
	}
	// Every reaper run tops the pool up; its instances turn idle once
	// ready.
	stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
		if r := d.Do("POST", "/reapTick", stacktest.SchedulerToken, "", ""); r.Status != http.StatusOK {
			return false, fmt.Sprintf("reapTick = %d %s", r.Status, r.Body)
		}
		pools := adminStatus(t, d).Pools
		for _, p := range pools {
			if p.Lab == "linux-vm" && p.Idle == 2 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("pools %+v", pools)
	})
	w := a.waiting("the pool ready", 30*time.Second, func(w waitingState) bool { return w.Pools && pool(w).Data["idle"] == "2" })
	a.tab.Screenshot("warm-pool-ready")
	if diff := cmp.Diff([]string{"linux-vm", "2", "2", "0", "0"}, pool(w).Cells); diff != "" {
		t.Errorf("the linux-vm pool row (-want +got):\n%s", diff)
	}

	d.Opened("s-pool", "linux-vm")
	w = a.waiting("an instance claimed", 30*time.Second, func(w waitingState) bool { return len(pool(w).Cells) == 5 && pool(w).Cells[4] == "1" })
	a.tab.Screenshot("warm-pool-claimed")
	if got := pool(w).Cells; got[1] != "2" || got[2] != "1" {
		t.Errorf("after one claim the row reads %q, want target 2, idle 1", got)
	}
	// Live sessions are students' sessions: the claimed instance is
	// s-pool's, the idle one is only the pool's.
	s := a.wait("the claimed session listed", 30*time.Second, func(s consoleState) bool { return len(s.Sessions) > 0 })
	if len(s.Sessions) != 1 || s.Sessions[0].Data["student"] != "s-pool" {
		t.Errorf("live sessions listed: %+v, want only s-pool's", s.Sessions)
	}
}
