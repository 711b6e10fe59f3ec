package portal_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
)

// classLabs is the shell lab a course reserves.
const classLabs = `labs:
- name: shell
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  nodes: [{role: workspace, cpu: 500m, memory: 512Mi}]
`

// A member of a course sees their classes in headless Chromium: the one
// that has started opens its lab with one click, and the session takes
// the class's reserved seat (its row records the reservation); one later
// in the day says when it opens, its button disabled; another course's
// class is not shown.
func TestMemberOpensTheirClass(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: classLabs})
	admin := d.Token("ops", "admin")
	now := d.Clock.Now().Truncate(time.Second)
	book := func(course string, start time.Time) {
		t.Helper()
		r := d.Do("POST", "/adminReserve", admin, fmt.Sprintf(`{"course":%q,"lab":"shell","seats":2,"start":%q,"end":%q}`,
			course, start.Format(time.RFC3339), start.Add(time.Hour).Format(time.RFC3339)), "")
		if r.Status != 201 {
			t.Fatalf("reserving for %s = %d %s", course, r.Status, r.Body)
		}
	}
	book("cs-101", now)
	book("cs-101", now.Add(3*time.Hour))
	book("math-7", now)

	s := visitWith(t, browser.Start(t, browser.Isolated), d, "ann", d.MemberToken("ann", "cs-101"))
	type shown struct {
		Texts    []string
		Disabled []bool
		Titles   []string
	}
	var got shown
	stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
		got = evaluate[shown](s, `(() => {
			const b = [...document.querySelectorAll("#class-list li")];
			return { Texts: b.map((li) => li.textContent), Disabled: b.map((li) => li.querySelector("button").disabled),
				Titles: b.map((li) => li.querySelector("button").title) };
		})()`)
		return len(got.Texts) == 2 && !got.Disabled[0], fmt.Sprintf("the classes read %+v", got)
	})
	s.tab.Screenshot("classes")
	if !strings.Contains(got.Texts[0], "cs-101: lab shell reserved from") || !got.Disabled[1] || !strings.HasPrefix(got.Titles[1], "Opens at") {
		t.Errorf("the classes read %+v; want cs-101's open now and the later one saying when it opens", got)
	}
	s.click("#class-list li button")
	s.waitPage("the class's lab running", 4*time.Minute, func(p pageState) bool { return p.Status == "running" })
	s.tab.Screenshot("class-running")
	if n := d.Count(`SELECT count(*) FROM sessions WHERE student = 'ann' AND reservation_id IS NOT NULL AND status = 'running'`); n != 1 {
		t.Errorf("ann's running sessions on a reserved seat: %d; want 1", n)
	}
}
