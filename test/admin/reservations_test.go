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

// An admin books a class in the console in a real Chromium, against the
// real stack: the form's reservation is listed and the timeline shows
// its seats reserved in its hour (and in the hour before, where its lead
// begins) beside the capacity, with what is in use now in the present
// hour; an over-booking shows the server's sentence naming the seats
// still free and books nothing; Cancel (asked twice) frees the seats.
func TestAdminBooksAClassOnTheTimeline(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{MaxVMs: 8, LabsYAML: `labs:
- {name: net, kind: vm, nodes: [{role: vm}], disk: {containerDisk: quay.io/containerdisks/fedora:41}}
`})
	if r := d.Open("pat", "net"); r.Status != http.StatusCreated {
		t.Fatalf("open for pat: %d %s", r.Status, r.Body)
	}
	d.WaitRunning("pat", time.Minute)

	a := signIn(t, browser.Start(t, browser.Isolated), d)
	s := a.wait("today's timeline with what is in use now", time.Minute, func(s consoleState) bool {
		h, ok := nowHour(s)
		return s.Booking && ok && len(h.Slots) > 0
	})
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
	book := func(seats int) {
		t.Helper()
		a.tab.Do(30*time.Second,
			chromedp.SetValue(chromedp.CSS("#reserve-course"), "cs-101"),
			chromedp.SetValue(chromedp.CSS("#reserve-lab"), "net"),
			chromedp.SetValue(chromedp.CSS("#reserve-seats"), fmt.Sprint(seats)),
			chromedp.Click(chromedp.CSS("#reserve-button")))
	}
	book(5)
	s = a.wait("the class booked", time.Minute, func(s consoleState) bool {
		return strings.Contains(s.Message, "reserved 5 seats of net for cs-101") && len(s.Reservations) == 1
	})
	a.tab.Screenshot("booked")
	r := s.Reservations[0]
	if r.Data["course"] != "cs-101" || r.Data["lab"] != "net" || r.Data["seats"] != "5" || r.Cells[5] != "ops" {
		t.Errorf("the reservation's row: %+v", r)
	}
	start, err := time.Parse(time.RFC3339, r.Data["start"])
	if err != nil || start.Minute() != 0 || !start.After(time.Now()) {
		t.Fatalf("the class starts %q (%v); want the next full hour", r.Data["start"], err)
	}
	s = a.wait("the class on the timeline", time.Minute, func(s consoleState) bool {
		c, ok := slotOf(s, r.Data["start"], "vm")
		return ok && c["reserved"] == "5"
	})
	if c, _ := slotOf(s, r.Data["start"], "vm"); c["free"] != "3" || c["capacity"] != "8" {
		t.Errorf("the class's hour: %v; want 5 of 8 reserved, 3 free", c)
	}
	// Its seats are held from its lead, 10 minutes before it starts: the
	// hour before shows them too (when that hour is on the day shown).
	if c, ok := slotOf(s, start.Add(-time.Hour).UTC().Format(time.RFC3339), "vm"); ok && c["reserved"] != "5" {
		t.Errorf("the hour before the class, where its lead begins: %v; want 5 reserved", c)
	}

	book(4)
	s = a.wait("the over-booking refused", time.Minute, func(s consoleState) bool { return strings.Contains(s.Message, "free") })
	if !strings.Contains(s.Message, "4 seats of lab net asked for, 3 free") || len(s.Reservations) != 1 {
		t.Errorf("over-booking: message %q, reservations %+v; want the 3 free seats named and nothing booked", s.Message, s.Reservations)
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
		return len(s.Reservations) == 0 && ok && c["reserved"] == "0"
	})
	if !strings.Contains(s.Message, "cancelled cs-101's 5 seats of net") {
		t.Errorf("after the cancel: message %q", s.Message)
	}
	a.tab.Screenshot("cancelled")
	if got := d.Do("GET", "/adminReservations", d.Token("ops", "admin"), "", ""); got.Status != http.StatusOK || strings.Contains(string(got.Body), "cs-101") {
		t.Errorf("the API still lists the cancelled class: %d %s", got.Status, got.Body)
	}
}
