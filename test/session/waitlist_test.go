package session_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"labkeep/localrun/stacktest"
	"labkeep/shared/reap"
)

func place(t *testing.T, r stacktest.Response) stacktest.SessionView {
	t.Helper()
	var v stacktest.SessionView
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("answer %d %s: %v", r.Status, r.Body, err)
	}
	return v
}

// openWaiting is student's openSession of lab with "wait": true.
func openWaiting(e *stacktest.Deployment, student, lab string) stacktest.Response {
	return e.Do("POST", "/openSession", e.Token(student, "student"), fmt.Sprintf(`{"lab":%q,"wait":true}`, lab), "")
}

func poll(e *stacktest.Deployment, student string) stacktest.Response {
	return e.Do("GET", "/getSession", e.Token(student, "student"), "", "")
}

// 30 students ask at once with wait for a lab of one VM under a limit of
// 8: 8 run, 22 wait with places 1…22 in the database's arrival order; as
// sessions close in random order, the waiting students are served one by
// one strictly in that order, by the close itself; nobody ever gets a
// second session, and the live count sampled throughout never exceeds 8.
func TestWaitlistServesInArrivalOrder(t *testing.T) {
	e := newEnv(t, stacktest.Options{MaxVMs: 8})
	const students, slots = 30, 8
	results := atOnce(students, func(i int) stacktest.Response {
		return openWaiting(e, fmt.Sprintf("w%02d", i), "linux-vm")
	})

	var stop atomic.Bool
	var peakRows, peakVMs atomic.Int64
	var samples atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			rows := int64(e.Count(`SELECT count(*) FROM sessions WHERE status IN ('provisioning','running')`))
			vms := int64(len(e.List(stacktest.Listing{Kinds: []string{"VirtualMachine"}})))
			for _, p := range []struct {
				peak *atomic.Int64
				n    int64
			}{{&peakRows, rows}, {&peakVMs, vms}} {
				if n := p.n; n > p.peak.Load() {
					p.peak.Store(n)
				}
			}
			samples.Add(1)
			time.Sleep(10 * time.Millisecond)
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()

	var running []string
	positions := map[string]int{}
	for i, r := range results {
		student := fmt.Sprintf("w%02d", i)
		switch r.Status {
		case http.StatusCreated:
			running = append(running, student)
		case http.StatusAccepted:
			v := place(t, r)
			if v.Status != "queued" || v.QueuePosition == nil || v.ETASeconds == nil || v.ETALatestSeconds == nil {
				t.Fatalf("%s: 202 without a place: %s", student, r.Body)
			}
			if *v.ETASeconds > *v.ETALatestSeconds {
				t.Errorf("%s: eta %ds beyond its latest %ds", student, *v.ETASeconds, *v.ETALatestSeconds)
			}
			positions[student] = *v.QueuePosition
		default:
			t.Fatalf("%s: open = %d %s", student, r.Status, r.Body)
		}
	}
	if len(running) != slots || len(positions) != students-slots {
		t.Fatalf("%d opened and %d queued, want %d and %d", len(running), len(positions), slots, students-slots)
	}
	line := lineOf(e)
	var wantPos, gotPos []int
	for i, s := range line {
		wantPos = append(wantPos, i+1)
		gotPos = append(gotPos, positions[s])
	}
	if diff := cmp.Diff(wantPos, gotPos); diff != "" {
		t.Fatalf("places given vs the database's arrival order %v (-want +got):\n%s", line, diff)
	}
	t.Logf("line in arrival order: %v", line)

	// A repeated open of a queued student (with or without wait) keeps
	// their entry and place.
	for _, s := range []string{line[0], line[10], line[21]} {
		for _, r := range []stacktest.Response{openWaiting(e, s, "linux-vm"), e.Open(s, "linux-vm")} {
			if v := place(t, r); r.Status != http.StatusAccepted || *v.QueuePosition != positions[s] {
				t.Errorf("%s re-opened: %d %s, want 202 at place %d", s, r.Status, r.Body, positions[s])
			}
		}
	}
	if diff := cmp.Diff(line, lineOf(e)); diff != "" {
		t.Fatalf("re-opens changed the line (-before +after):\n%s", diff)
	}

	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	var served []string
	for len(running) > 0 {
		i := rng.IntN(len(running))
		who := running[i]
		running = slices.Delete(running, i, i+1)
		if r := e.Close(who); r.Status != http.StatusOK {
			t.Fatalf("close %s = %d %s", who, r.Status, r.Body)
		}
		if len(served) < len(line) {
			next := line[len(served)]
			served = append(served, next)
			running = append(running, next)
		}
		var live []string
		for id := range e.LiveIDs() {
			live = append(live, e.Session(id).Student)
		}
		slices.Sort(live)
		want := slices.Clone(running)
		slices.Sort(want)
		if diff := cmp.Diff(want, live, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("after closing %s (served so far %v), live students (-want +got):\n%s", who, served, diff)
		}
		// Everyone still waiting moved up by one.
		for i, s := range lineOf(e) {
			if v := place(t, poll(e, s)); v.QueuePosition == nil || *v.QueuePosition != i+1 {
				t.Fatalf("after %d served, %s reads %+v, want place %d", len(served), s, v, i+1)
			}
		}
	}
	if diff := cmp.Diff(line, served); diff != "" {
		t.Fatalf("served order vs arrival order (-want +got):\n%s", diff)
	}
	if twice := e.Count(`SELECT count(*) FROM (SELECT student FROM sessions GROUP BY student HAVING count(*) > 1) s`); twice != 0 {
		t.Errorf("%d students got more than one session", twice)
	}
	if n := e.Count(`SELECT count(*) FROM sessions WHERE status = 'closed'`); n != students {
		t.Errorf("%d closed sessions, want one per student (%d)", n, students)
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d samples: peak live rows %d, peak VMs %d (limit %d)", samples.Load(), peakRows.Load(), peakVMs.Load(), slots)
	if peakRows.Load() > slots || peakVMs.Load() > slots {
		t.Errorf("overshoot: peak live rows %d, peak VMs %d, limit %d", peakRows.Load(), peakVMs.Load(), slots)
	}
	if samples.Load() < 10 {
		t.Errorf("only %d samples of the live count", samples.Load())
	}
	e.WaitNoObjects()
}

// lineOf is the waitlist's students in the database's arrival order.
func lineOf(e *stacktest.Deployment) []string {
	return e.Strings(`SELECT student FROM waitlist ORDER BY seq`)
}

// A student who stops polling loses their place once QueueIdle (2 min)
// has passed, at the next look by anyone, and everyone behind moves up; a
// queued student who closes leaves the line; without "wait" a full open is
// still refused 503; capacity freed by an expiry is handed on by the
// reaper's run.
func TestWaitlistDropsIdleAndReaperServes(t *testing.T) {
	e := newEnv(t, stacktest.Options{MaxVMs: 1, Lifetime: 10 * time.Minute})
	e.Opened("holder", "linux-vm")
	for i, s := range []string{"amy", "ben", "cat", "dan"} {
		r := openWaiting(e, s, "linux-vm")
		if v := place(t, r); r.Status != http.StatusAccepted || *v.QueuePosition != i+1 {
			t.Fatalf("%s: %d %s, want 202 at place %d", s, r.Status, r.Body, i+1)
		}
	}
	if r := e.Open("eve", "linux-vm"); r.Status != http.StatusServiceUnavailable || r.Code != "no_capacity" {
		t.Fatalf("open without wait at capacity = %d %s, want 503 no_capacity", r.Status, r.Body)
	}
	places := func(students ...string) []int {
		t.Helper()
		var out []int
		for _, s := range students {
			r := poll(e, s)
			v := place(t, r)
			if r.Status != http.StatusOK || v.QueuePosition == nil {
				out = append(out, 0)
				continue
			}
			out = append(out, *v.QueuePosition)
		}
		return out
	}
	// ben stops polling; the others poll every 90s.
	e.Clock.Advance(90 * time.Second)
	if diff := cmp.Diff([]int{1, 3, 4}, places("amy", "cat", "dan")); diff != "" {
		t.Fatalf("places after 90s (-want +got):\n%s", diff)
	}
	e.Clock.Advance(90 * time.Second) // ben: 180s without a poll
	if diff := cmp.Diff([]int{1, 2, 3}, places("amy", "cat", "dan")); diff != "" {
		t.Fatalf("places once ben is idle (-want +got):\n%s", diff)
	}
	if r := poll(e, "ben"); r.Status == http.StatusOK && place(t, r).Status == "queued" {
		t.Fatalf("ben still queued after 180s without a poll: %s", r.Body)
	}
	if r := e.Close("cat"); r.Status != http.StatusOK || r.Session.Status != "closed" {
		t.Fatalf("cat leaves the line: %d %s", r.Status, r.Body)
	}
	if diff := cmp.Diff([]int{1, 2}, places("amy", "dan")); diff != "" {
		t.Fatalf("places once cat left (-want +got):\n%s", diff)
	}

	// The holder's time runs out; the waiting keep polling meanwhile.
	for range 8 {
		e.Clock.Advance(time.Minute)
		places("amy", "dan")
	}
	if got := places("amy", "dan"); got[0] != 1 {
		t.Fatalf("before the reaper run amy reads place %d", got[0])
	}
	if _, err := e.App.Reaper.RunOnce(context.Background(), reap.TriggerAdmin); err != nil {
		t.Fatal(err)
	}
	amy := e.WaitRunning("amy", 30*time.Second)
	if got := places("dan"); got[0] != 1 {
		t.Errorf("dan reads place %d once amy was served, want 1", got[0])
	}
	if n := e.Count(`SELECT count(*) FROM sessions WHERE status IN ('provisioning','running')`); n != 1 {
		t.Errorf("%d live sessions, want amy's alone", n)
	}
	t.Logf("amy served by the reaper's run after the holder expired: %s", amy.ID)
}

// VMs and workspace Pods are separate pools with a line each: a student
// waiting for the shell Pod lab is first in the Pods' line however many
// wait for VMs, and is served when a Pod frees while the VM line still
// waits.
func TestWaitlistLinePerPool(t *testing.T) {
	e := newEnv(t, stacktest.Options{MaxVMs: 1, MaxPods: 1})
	e.Opened("vm-holder", "linux-vm")
	e.Opened("pod-holder", "shell")
	for i, s := range []string{"vm-1", "vm-2"} {
		if r := openWaiting(e, s, "linux-vm"); r.Status != http.StatusAccepted || *place(t, r).QueuePosition != i+1 {
			t.Fatalf("%s: %d %s, want 202 at place %d", s, r.Status, r.Body, i+1)
		}
	}
	r := openWaiting(e, "pod-1", "shell")
	if r.Status != http.StatusAccepted || *place(t, r).QueuePosition != 1 {
		t.Fatalf("pod-1: %d %s, want 202 at place 1 of the Pods' line", r.Status, r.Body)
	}
	if r := e.Close("pod-holder"); r.Status != http.StatusOK {
		t.Fatalf("close pod-holder = %d %s", r.Status, r.Body)
	}
	e.WaitRunning("pod-1", 60*time.Second)
	for i, s := range []string{"vm-1", "vm-2"} {
		if v := place(t, poll(e, s)); v.Status != "queued" || *v.QueuePosition != i+1 {
			t.Errorf("%s reads %+v once a Pod freed, want still queued at place %d", s, v, i+1)
		}
	}
}
