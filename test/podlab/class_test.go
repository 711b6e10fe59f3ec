package podlab_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/benchtable"
	"labkeep/localrun/stacktest"
	"labkeep/shared/reservation"
	"labkeep/shared/session"
)

// classLabs is a Pod lab small enough that a class's two workspace Pods
// and one more fit the node's two CPUs.
const classLabs = `labs:
- name: lab-shell
  description: A small shell for a class.
  kind: pod
  image: ghcr.io/labkeep/workspace:debian12
  nodes: [{role: workspace, cpu: 300m, memory: 256Mi}]
`

// A class's warm instances follow the timetable, on the real node, with
// no pool schedule written: cs-101 reserves 2 seats of lab-shell at T.
// Before T - lead nothing runs for it; from T - lead a reaper run starts
// its two workspace Pods; at T a student of no course opening the lab
// never gets one, and a member's open takes a ready one (the answer is
// that Pod's session, running) and logs in over SSH with their own key
// at once; the seat is the member's. After the seats are released the
// instance nobody claimed is gone, and the member's session runs on.
func TestClassWarmInstancesFollowTheTimetable(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: classLabs, MaxPods: 8})
	rules := d.App.Config.Reservations
	T := d.Clock.Now().Add(time.Hour).Truncate(time.Minute)
	id := bookClass(t, d, "cs-101", 2, T)

	d.Clock.Set(T.Add(-rules.Lead - time.Minute))
	reapTick(t, d)
	if n := d.Count(`SELECT count(*) FROM sessions WHERE reservation_id = $1`, id); n != 0 {
		t.Fatalf("%d sessions for the class before its lead; want none", n)
	}
	ready := warmClass(t, d, id, T, 2)

	d.Clock.Set(T)
	other := d.Do("POST", "/openSession", d.Token("otto", "student"), `{"lab":"lab-shell"}`, "")
	if other.Status != http.StatusCreated || slices.Contains(ready, other.Session.ID) {
		t.Fatalf("a student of no course opening the class's lab = %d %s; want a session of their own, not the class's %v", other.Status, other.Body, ready)
	}
	if r := d.Close("otto"); r.Status != http.StatusOK {
		t.Fatalf("close otto = %d %s", r.Status, r.Body)
	}

	s := memberOpens(t, d, "ann", "cs-101", ready)
	t.Logf("member's open answered in %s, running; open → first SSH login %s (a ready class instance on the real node)",
		s.runningAt.Sub(s.openedAt).Round(time.Millisecond), time.Since(s.openedAt).Round(time.Millisecond))
	if got := strings.TrimSpace(s.mustRun("id -u")); got != "0" {
		t.Errorf("logged in as uid %q, want root", got)
	}
	if n := d.Count(`SELECT count(*) FROM sessions WHERE id = $1 AND reservation_id = $2 AND student = 'ann'`, s.opened.ID, id); n != 1 {
		t.Errorf("ann's session does not hold the class's seat")
	}

	left := slices.DeleteFunc(slices.Clone(ready), func(x string) bool { return x == s.opened.ID })
	d.Clock.Set(rules.HeldUntil(reservation.Hold{Reservation: reservation.Reservation{Start: T, End: T.Add(time.Hour)}}).Add(time.Minute))
	reapTick(t, d)
	for _, x := range left {
		d.WaitGone(x)
	}
	if got := d.RowStatus(s.opened.ID); got != session.StatusRunning {
		t.Errorf("ann's session is %s after the release; want it running", got)
	}
	s.close()
	d.WaitGone(s.opened.ID)
}

// bookClass books seats of lab-shell for course from T for an hour, as
// an admin, and returns the reservation's id.
func bookClass(t testing.TB, d *stacktest.Deployment, course string, seats int, T time.Time) int64 {
	t.Helper()
	r := d.Do("POST", "/adminReserve", d.Token("ops", "admin"),
		fmt.Sprintf(`{"course":%q,"lab":"lab-shell","seats":%d,"start":%q,"end":%q}`, course, seats, T.Format(time.RFC3339), T.Add(time.Hour).Format(time.RFC3339)), "")
	if r.Status != http.StatusCreated {
		t.Fatalf("reserve = %d %s", r.Status, r.Body)
	}
	var booked struct {
		Reservation struct {
			ID int64 `json:"id"`
		} `json:"reservation"`
	}
	if err := json.Unmarshal(r.Body, &booked); err != nil {
		t.Fatal(err)
	}
	return booked.Reservation.ID
}

// reapTick runs the reaper as the schedule does.
func reapTick(t testing.TB, d *stacktest.Deployment) {
	t.Helper()
	if r := d.Do("POST", "/reapTick", stacktest.SchedulerToken, "", ""); r.Status != http.StatusOK {
		t.Fatalf("reapTick = %d %s", r.Status, r.Body)
	}
}

// warmClass sets d's clock a minute into reservation id's lead (it starts
// at T) and runs the reaper until the class's n instances are ready: the
// first run must start all n. It returns their ids.
func warmClass(t testing.TB, d *stacktest.Deployment, id int64, T time.Time, n int) []string {
	t.Helper()
	instances := func(status string) []string {
		return d.Strings(`SELECT id::text FROM sessions WHERE reservation_id = $1 AND pool = 'idle' AND status = $2 ORDER BY id`, id, status)
	}
	d.Clock.Set(T.Add(-d.App.Config.Reservations.Lead + time.Minute))
	reapTick(t, d)
	if booting := append(instances("provisioning"), instances("running")...); len(booting) != n {
		t.Fatalf("the class's instances right after the reaper run in its lead: %v; want %d", booting, n)
	}
	var ready []string
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		reapTick(t, d)
		ready = instances("running")
		return len(ready) == n, fmt.Sprintf("%d of the class's instances ready", len(ready))
	})
	return ready
}

// memberOpens opens lab-shell for name, a member of course, with a key of
// their own, wants one of the class's ready instances (answered running)
// and waits for their first SSH login.
func memberOpens(t testing.TB, d *stacktest.Deployment, name, course string, ready []string) *student {
	t.Helper()
	s := openLabWith(t, d, d.MemberToken(name, course), name, "lab-shell", stacktest.NewKey(t))
	if !slices.Contains(ready, s.opened.ID) || s.opened.Status != "running" {
		t.Fatalf("member's open = %s %s; want one of the class's ready instances %v, running", s.opened.ID, s.opened.Status, ready)
	}
	s.running, s.runningAt = s.opened, time.Now()
	s.waitSSH(30 * time.Second)
	return s
}

// BenchmarkTableClassOpenToLogin: a class member's open to their first
// SSH login, served by the instance the timetable started in the class's
// lead, against a cold provision of the same lab by a student of no
// course, on the real node.
func BenchmarkTableClassOpenToLogin(b *testing.B) {
	samples := 5
	if benchtable.Quick() {
		samples = 1
	}
	d := stacktest.Deploy(b, st, stacktest.Options{LabsYAML: classLabs, MaxPods: 8, Log: stacktest.Discard()})
	for range b.N {
		var member, cold []time.Duration
		for i := range samples {
			start := time.Now()
			c := openLab(b, d, fmt.Sprintf("cold-%d", i), "lab-shell", stacktest.NewKey(b))
			c.waitRunning(3 * time.Minute)
			c.waitSSH(time.Minute)
			cold = append(cold, time.Since(start))
			c.close()
			d.WaitGone(c.opened.ID)

			course := fmt.Sprintf("class-%d", i)
			T := d.Clock.Now().Add(time.Hour).Truncate(time.Minute)
			ready := warmClass(b, d, bookClass(b, d, course, 1, T), T, 1)
			d.Clock.Set(T)
			s := memberOpens(b, d, fmt.Sprintf("member-%d", i), course, ready)
			member = append(member, time.Since(s.openedAt))
			s.close()
			d.WaitGone(s.opened.ID)
		}
		recordMedians(b, benchtable.Row{
			Group: "Class reservation", Case: "lab-shell (300m CPU workspace Pod) on the real node, 1 seat", Figure: "member's open → first SSH login (median)",
			Baseline: "cold provision of the same lab by a student of no course",
			Note:     fmt.Sprintf("%d samples each; the class's instance started by the reaper in the lead; member %v, cold %v", samples, member, cold),
		}, member, cold, "member-ms", "cold-ms")
	}
}
