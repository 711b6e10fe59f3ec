package admin_test

import (
	"strings"
	"testing"
	"time"

	"labkeep/localrun/browser"
	"labkeep/localrun/stacktest"
	"labkeep/shared/kube"
)

// The admin console in a real Chromium lists every student's home with
// its size and the day an unused one goes, and deletes one no session
// holds (after a second click); a home in use has no Delete.
func TestAdminConsoleListsAndDeletesHomes(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{LabsYAML: `labs:
- {name: vm-home, kind: vm, nodes: [{role: vm}], disk: {containerDisk: quay.io/containerdisks/fedora:41}, home: {size: 1Gi, mountPath: /home/student}}
`})
	for _, student := range []string{"erin", "frank"} {
		if r := d.Open(student, "vm-home"); r.Status != 201 {
			t.Fatalf("open for %s: %d %s", student, r.Status, r.Body)
		}
		d.WaitRunning(student, time.Minute)
	}
	if r := d.Close("erin"); r.Status != 200 {
		t.Fatalf("close: %d %s", r.Status, r.Body)
	}
	erin, frank := kube.HomeName(d.Env, "erin", "vm"), kube.HomeName(d.Env, "frank", "vm")

	a := signIn(t, browser.Start(t, browser.Isolated), d)
	s := a.wait("both homes", time.Minute, func(s consoleState) bool { return len(s.Homes) == 2 })
	a.tab.Screenshot("homes")
	e, ok1 := find(s.Homes, "home", erin)
	f, ok2 := find(s.Homes, "home", frank)
	// Student, home, size, last used, deleted on, actions.
	if !ok1 || !ok2 || e.Cells[0] != "erin" || e.Cells[1] != "vm" || e.Cells[2] != "1Gi" || !strings.Contains(e.Cells[4], "-") || e.Cells[5] != "Delete" {
		t.Errorf("erin's home row %+v (found %v)", e, ok1)
	}
	if f.Cells[0] != "frank" || f.Cells[4] != "in use" || f.Cells[5] != "" {
		t.Errorf("frank's home row %+v; want it in use with no Delete (found %v)", f, ok2)
	}
	sel := `button[data-delete-home="` + erin + `"]`
	a.click(sel)
	if s := a.state(); len(s.Homes) != 2 {
		t.Errorf("one click deleted a home: %+v", s.Homes)
	}
	a.click(sel)
	s = a.wait("erin's home gone", time.Minute, func(s consoleState) bool { return len(s.Homes) == 1 })
	if _, ok := find(s.Homes, "home", frank); !ok || !strings.Contains(s.Message, "deleted erin's home") {
		t.Errorf("after the delete: homes %+v, message %q", s.Homes, s.Message)
	}
	a.tab.Screenshot("home-deleted")
}
