package podlab_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

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
	r := d.Do("POST", "/adminReserve", d.Token("ops", "admin"),
		fmt.Sprintf(`{"course":"cs-101","lab":"lab-shell","seats":2,"start":%q,"end":%q}`, T.Format(time.RFC3339), T.Add(time.Hour).Format(time.RFC3339)), "")
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
	id := booked.Reservation.ID
	reap := func() {
		t.Helper()
		if r := d.Do("POST", "/reapTick", stacktest.SchedulerToken, "", ""); r.Status != http.StatusOK {
			t.Fatalf("reapTick = %d %s", r.Status, r.Body)
		}
	}
	instances := func(status string) []string {
		return d.Strings(`SELECT id::text FROM sessions WHERE reservation_id = $1 AND pool = 'idle' AND status = $2 ORDER BY id`, id, status)
	}

	d.Clock.Set(T.Add(-rules.Lead - time.Minute))
	reap()
	if n := d.Count(`SELECT count(*) FROM sessions WHERE reservation_id = $1`, id); n != 0 {
		t.Fatalf("%d sessions for the class before its lead; want none", n)
	}
	d.Clock.Set(T.Add(-rules.Lead + time.Minute))
	reap()
	booting := append(instances("provisioning"), instances("running")...)
	if len(booting) != 2 {
		t.Fatalf("the class's instances right after the reaper run in its lead: %v; want 2", booting)
	}
	var ready []string
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		reap()
		ready = instances("running")
		return len(ready) == 2, fmt.Sprintf("%d of the class's instances ready", len(ready))
	})

	d.Clock.Set(T)
	other := d.Do("POST", "/openSession", d.Token("otto", "student"), `{"lab":"lab-shell"}`, "")
	if other.Status != http.StatusCreated || slices.Contains(ready, other.Session.ID) {
		t.Fatalf("a student of no course opening the class's lab = %d %s; want a session of their own, not the class's %v", other.Status, other.Body, ready)
	}
	if r := d.Close("otto"); r.Status != http.StatusOK {
		t.Fatalf("close otto = %d %s", r.Status, r.Body)
	}

	key := stacktest.NewKey(t)
	s := &student{t: t, d: d, name: "ann", key: key, openedAt: time.Now()}
	body := fmt.Sprintf(`{"lab":"lab-shell","publicKey":%q}`, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key.PublicKey()))))
	open := d.Do("POST", "/openSession", d.MemberToken("ann", "cs-101"), body, "")
	if open.Status != http.StatusCreated || !slices.Contains(ready, open.Session.ID) || open.Session.Status != "running" {
		t.Fatalf("member's open = %d %s; want one of the class's ready instances %v, running", open.Status, open.Body, ready)
	}
	s.opened, s.running, s.runningAt = open.Session, open.Session, time.Now()
	s.waitSSH(30 * time.Second)
	t.Logf("member's open answered in %s, running; open → first SSH login %s (a ready class instance on the real node)",
		s.runningAt.Sub(s.openedAt).Round(time.Millisecond), time.Since(s.openedAt).Round(time.Millisecond))
	if got := strings.TrimSpace(s.mustRun("id -u")); got != "0" {
		t.Errorf("logged in as uid %q, want root", got)
	}
	if n := d.Count(`SELECT count(*) FROM sessions WHERE id = $1 AND reservation_id = $2 AND student = 'ann'`, open.Session.ID, id); n != 1 {
		t.Errorf("ann's session does not hold the class's seat")
	}

	left := slices.DeleteFunc(slices.Clone(ready), func(x string) bool { return x == open.Session.ID })
	d.Clock.Set(rules.HeldUntil(reservation.Hold{Reservation: reservation.Reservation{Start: T, End: T.Add(time.Hour)}}).Add(time.Minute))
	reap()
	for _, x := range left {
		d.WaitGone(x)
	}
	if got := d.RowStatus(open.Session.ID); got != session.StatusRunning {
		t.Errorf("ann's session is %s after the release; want it running", got)
	}
	s.close()
	d.WaitGone(open.Session.ID)
}
