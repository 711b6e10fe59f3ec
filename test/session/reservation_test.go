package session_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"labkeep/localrun/stacktest"
)

// A class gets its seats, on the real stack (capacity 8 VMs, no
// ResourceQuota: every refusal is labkeep's own count). Course cs-101
// reserves 5 seats of linux-vm from T for an hour; at T (the functions'
// clock) 20 students of no course and the class's 5 open at once, in a
// random order: all 5 members get their seats, the others exactly the 3
// left, and no sample of the VMs in the namespace ever passes 8. Then: a
// member's seat freed before the release is held for the class again;
// after the release the seats nobody took go to anyone; a reservation
// made now holds its seats and, cancelled, frees them at once; a booking
// past the capacity names the seats free.
func TestReservedSeatsGoToTheClass(t *testing.T) {
	e := newEnv(t, stacktest.Options{MaxVMs: 8, Quota: false})
	admin := e.Token("ops", "admin")
	rules := e.App.Config.Reservations
	reserve := func(course string, seats int, start time.Time) stacktest.Response {
		t.Helper()
		return e.Do("POST", "/adminReserve", admin, fmt.Sprintf(`{"course":%q,"lab":"linux-vm","seats":%d,"start":%q,"end":%q}`,
			course, seats, start.Format(time.RFC3339), start.Add(time.Hour).Format(time.RFC3339)), "")
	}
	at := e.Clock.Now().Add(30 * time.Minute).Truncate(time.Second)
	if r := reserve("cs-101", 5, at); r.Status != 201 {
		t.Fatalf("reserving 5 seats = %d %s", r.Status, r.Body)
	}
	if r := reserve("math-7", 4, at.Add(30*time.Minute)); r.Status != 409 || !strings.Contains(r.Message, "3 free") {
		t.Errorf("reserving 4 more seats beside them = %d %s; want 409 overbooked naming 3 free", r.Status, r.Body)
	}
	e.Clock.Set(at)

	// The burst, with the VMs sampled throughout.
	var most atomic.Int32
	stop := make(chan struct{})
	var sampled sync.WaitGroup
	sampled.Go(func() {
		for {
			if n := int32(len(e.List(stacktest.Listing{Kinds: []string{"VirtualMachine"}}))); n > most.Load() {
				most.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	type opener struct {
		name   string
		member bool
	}
	var openers []opener
	for i := range 20 {
		openers = append(openers, opener{fmt.Sprintf("other-%02d", i), false})
	}
	for i := range 5 {
		openers = append(openers, opener{fmt.Sprintf("member-%d", i), true})
	}
	rand.Shuffle(len(openers), func(i, j int) { openers[i], openers[j] = openers[j], openers[i] })
	results := atOnce(len(openers), func(i int) stacktest.Response {
		if openers[i].member {
			return e.OpenAsMember(openers[i].name, "linux-vm", "cs-101")
		}
		return e.Open(openers[i].name, "linux-vm")
	})
	close(stop)
	sampled.Wait()

	var members, others []string
	for i, r := range results {
		switch {
		case r.Status == 201 && openers[i].member:
			members = append(members, openers[i].name)
		case r.Status == 201:
			others = append(others, openers[i].name)
		case openers[i].member:
			t.Errorf("member %s = %d %s; want a seat", openers[i].name, r.Status, r.Body)
		case r.Status != 503 || r.Code != "no_capacity":
			t.Errorf("%s = %d %s; want 503 no_capacity", openers[i].name, r.Status, r.Body)
		}
	}
	t.Logf("members seated %d, others %d, most VMs sampled %d", len(members), len(others), most.Load())
	if len(members) != 5 || len(others) != 3 || most.Load() > 8 {
		t.Fatalf("%d members and %d others opened, at most %d VMs seen; want 5, 3 and never past 8", len(members), len(others), most.Load())
	}
	for _, m := range members {
		e.WaitRunning(m, 2*time.Minute)
	}
	if n := e.Count(`SELECT count(*) FROM sessions WHERE reservation_id IS NOT NULL AND status IN ('provisioning','running')`); n != 5 {
		t.Errorf("%d live sessions hold a reserved seat; want the 5 members'", n)
	}
	for state, want := range map[string]float64{"reserved": 5, "taken": 5, "held": 0} {
		if got := metric(t, e, "labkeep_reserved_seats", map[string]string{"course": "cs-101", "lab": "linux-vm", "state": state}); got != want {
			t.Errorf("labkeep_reserved_seats{state=%q} = %v; want %v", state, got, want)
		}
	}

	// A member leaves before the release: their seat is the class's again.
	if r := e.Close(members[0]); r.Status != 200 {
		t.Fatalf("closing %s = %d %s", members[0], r.Status, r.Body)
	}
	e.WaitGone(liveID(t, e, members[0]))
	if r := e.Open("other-late", "linux-vm"); r.Status != 503 {
		t.Errorf("another student at a free seat the class holds = %d %s; want 503", r.Status, r.Body)
	}
	// The class's instructor takes no seat of it: their own lab opens in
	// the general line.
	if r := e.Do("POST", "/openSession", e.InstructorToken("prof", "cs-101"), `{"lab":"linux-vm"}`, ""); r.Status != 503 {
		t.Errorf("cs-101's instructor at a free seat the class holds = %d %s; want 503", r.Status, r.Body)
	}
	// After the release nobody's seat is held.
	e.Clock.Set(at.Add(rules.Release))
	if r := e.Open("other-late", "linux-vm"); r.Status != 201 {
		t.Errorf("another student after the release = %d %s; want 201", r.Status, r.Body)
	}

	// A reservation starting now holds its seats at once; cancelled, it
	// frees them at once.
	if r := e.Close("other-late"); r.Status != 200 {
		t.Fatal(r.Body)
	}
	now := e.Clock.Now().Truncate(time.Second)
	r := reserve("net-201", 1, now)
	if r.Status != 201 {
		t.Fatalf("reserving a seat now = %d %s", r.Status, r.Body)
	}
	var booked struct{ Reservation struct{ ID int64 } }
	if err := json.Unmarshal([]byte(r.Body), &booked); err != nil {
		t.Fatal(err)
	}
	waitNoVMBeyond(t, e, 7)
	if r := e.Open("other-later", "linux-vm"); r.Status != 503 {
		t.Errorf("another student at the seat net-201 holds = %d %s; want 503", r.Status, r.Body)
	}
	if r := e.Do("POST", "/adminCancelReservation", admin, fmt.Sprintf(`{"id":%d}`, booked.Reservation.ID), ""); r.Status != 200 {
		t.Fatalf("cancelling = %d %s", r.Status, r.Body)
	}
	if r := e.Open("other-later", "linux-vm"); r.Status != 201 {
		t.Errorf("another student once the reservation is cancelled = %d %s; want 201", r.Status, r.Body)
	}
}

// liveID is student's latest session id.
func liveID(t *testing.T, e *stacktest.Deployment, student string) string {
	t.Helper()
	ids := e.Strings(`SELECT id::text FROM sessions WHERE student = $1 ORDER BY started_at DESC LIMIT 1`, student)
	if len(ids) != 1 {
		t.Fatalf("no session of %s", student)
	}
	return ids[0]
}

// waitNoVMBeyond waits until the namespace holds at most n VMs (a closed
// session's VM goes with its teardown).
func waitNoVMBeyond(t *testing.T, e *stacktest.Deployment, n int) {
	t.Helper()
	stacktest.Eventually(t, time.Minute, func() (bool, string) {
		got := len(e.List(stacktest.Listing{Kinds: []string{"VirtualMachine"}}))
		return got <= n, fmt.Sprintf("%d VMs", got)
	})
}
