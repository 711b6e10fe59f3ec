package admin_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
)

// slotOf is the cell of bucket kind in the timeline's hour that starts at
// start (RFC 3339, as the API gives it).
func slotOf(s consoleState, start, kind string) (map[string]string, bool) {
	for _, h := range s.Timeline {
		if h.Data["start"] != start {
			continue
		}
		for _, c := range h.Slots {
			if c["kind"] == kind {
				return c, true
			}
		}
	}
	return nil, false
}

// nowHour is the timeline's present hour.
func nowHour(s consoleState) (hourRow, bool) {
	for _, h := range s.Timeline {
		if h.Data["now"] == "true" {
			return h, true
		}
	}
	return hourRow{}, false
}

// An instructor books their class in the console in a real Chromium,
// against the real stack. Their token shows the class reservations alone
// (none of the admin's parts); the form's reservation is listed and the
// timeline shows its seats reserved in its hour (and in the hour before,
// where its lead begins) beside the capacity, with what is in use now in
// the present hour. Another course's reservation counts on the timeline
// but is not listed; booking another course is refused, saying which
// courses are theirs, and they stay signed in; an over-booking shows the
// server's sentence naming the seats still free and books nothing;
// Cancel (asked twice) frees the seats.
func TestInstructorBooksAClassOnTheTimeline(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 8, LabsYAML: `labs:
- {name: net, kind: vm, nodes: [{role: vm}], disk: {containerDisk: quay.io/containerdisks/fedora:41}}
`})
	if r := d.Open("pat", "net"); r.Status != http.StatusCreated {
		t.Fatalf("open for pat: %d %s", r.Status, r.Body)
	}
	d.WaitRunning("pat", time.Minute)

	a := signInWith(t, browser.Start(t, browser.Isolated), d, d.InstructorToken("prof", "cs-101"))
	s := a.wait("today's timeline with what is in use now", time.Minute, func(s consoleState) bool {
		h, ok := nowHour(s)
		return s.Booking && ok && len(h.Slots) > 0
	})
	if s.AdminParts || !strings.Contains(s.Role, "instructor") {
		t.Errorf("an instructor's console: admin parts shown %v, role %q; want the reservations alone, as an instructor", s.AdminParts, s.Role)
	}
	now, _ := nowHour(s)
	vms := map[string]string{}
	for _, c := range now.Slots {
		if c["kind"] == "vm" {
			vms = c
		}
	}
	if vms["used"] != "1" || vms["capacity"] != "8" || vms["reserved"] != "0" || vms["free"] != "8" {
		t.Errorf("the present hour's VMs before any booking: %v; want 1 in use, 0 of 8 reserved, 8 free", vms)
	}
	if len(s.Timeline) < 23 || len(s.Timeline) > 25 {
		t.Errorf("today's timeline has %d hours", len(s.Timeline))
	}

	// The form starts at the next full hour, for an hour.
	book := func(course string, seats int) {
		t.Helper()
		a.tab.Do(30*time.Second,
			chromedp.SetValue(chromedp.CSS("#reserve-course"), course),
			chromedp.SetValue(chromedp.CSS("#reserve-lab"), "net"),
			chromedp.SetValue(chromedp.CSS("#reserve-seats"), fmt.Sprint(seats)),
			chromedp.Click(chromedp.CSS("#reserve-button")))
	}
	book("math-7", 1)
	s = a.wait("another course refused", time.Minute, func(s consoleState) bool { return strings.Contains(s.Message, "math-7") })
	if want := `an instructor books only the courses their token lists (cs-101), not "math-7"`; !strings.Contains(s.Message, want) || !s.Console || len(s.Reservations) != 0 {
		t.Errorf("booking another course: message %q, signed in %v, reservations %+v; want %q, still signed in, nothing booked", s.Message, s.Console, s.Reservations, want)
	}

	book("cs-101", 5)
	s = a.wait("the class booked", time.Minute, func(s consoleState) bool {
		return strings.Contains(s.Message, "reserved 5 seats of net for cs-101") && len(s.Reservations) == 1
	})
	a.tab.Screenshot("booked")
	r := s.Reservations[0]
	if r.Data["course"] != "cs-101" || r.Data["lab"] != "net" || r.Data["seats"] != "5" || r.Cells[5] != "prof" {
		t.Errorf("the reservation's row: %+v", r)
	}
	start, err := time.Parse(time.RFC3339, r.Data["start"])
	if err != nil || start.Minute() != 0 || !start.After(time.Now()) {
		t.Fatalf("the class starts %q (%v); want the next full hour", r.Data["start"], err)
	}
	// An admin books a seat for math-7 in the same hour.
	other := fmt.Sprintf(`{"course":"math-7","lab":"net","seats":1,"start":%q,"end":%q}`, r.Data["start"], r.Data["end"])
	if got := d.Do("POST", "/adminReserve", d.Token("ops", "admin"), other, "application/json"); got.Status != http.StatusCreated {
		t.Fatalf("the admin's booking for math-7: %d %s", got.Status, got.Body)
	}
	s = a.wait("both classes on the timeline", time.Minute, func(s consoleState) bool {
		c, ok := slotOf(s, r.Data["start"], "vm")
		return ok && c["reserved"] == "6"
	})
	if c, _ := slotOf(s, r.Data["start"], "vm"); c["free"] != "2" || c["capacity"] != "8" || len(s.Reservations) != 1 {
		t.Errorf("the class's hour: %v, reservations listed %+v; want 6 of 8 reserved, 2 free, only cs-101's listed", c, s.Reservations)
	}
	// Its seats are held from its lead, 10 minutes before it starts: the
	// hour before shows them too (when that hour is on the day shown).
	if c, ok := slotOf(s, start.Add(-time.Hour).UTC().Format(time.RFC3339), "vm"); ok && c["reserved"] != "6" {
		t.Errorf("the hour before the class, where its lead begins: %v; want 6 reserved", c)
	}

	book("cs-101", 4)
	s = a.wait("the over-booking refused", time.Minute, func(s consoleState) bool { return strings.Contains(s.Message, "free") })
	if !strings.Contains(s.Message, "4 seats of lab net asked for, 2 free") || len(s.Reservations) != 1 {
		t.Errorf("over-booking: message %q, reservations %+v; want the 2 free seats named and nothing booked", s.Message, s.Reservations)
	}
	a.tab.Screenshot("overbooked")

	sel := `button[data-cancel-reservation="` + r.Data["reservation"] + `"]`
	a.click(sel)
	if s := a.state(); len(s.Reservations) != 1 {
		t.Errorf("one click cancelled the reservation: %+v", s.Reservations)
	}
	a.click(sel)
	s = a.wait("the reservation cancelled", time.Minute, func(s consoleState) bool {
		c, ok := slotOf(s, r.Data["start"], "vm")
		return len(s.Reservations) == 0 && ok && c["reserved"] == "1"
	})
	if !strings.Contains(s.Message, "cancelled cs-101's 5 seats of net") {
		t.Errorf("after the cancel: message %q", s.Message)
	}
	a.tab.Screenshot("cancelled")
	if got := d.Do("GET", "/adminReservations", d.Token("ops", "admin"), "", ""); got.Status != http.StatusOK || strings.Contains(string(got.Body), "cs-101") || !strings.Contains(string(got.Body), "math-7") {
		t.Errorf("after the cancel the API lists: %d %s; want math-7's class alone", got.Status, got.Body)
	}
}
