package podlab_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/stacktest"
	"labkeep/shared/reap"
)

// fillShellPool runs the reaper (which keeps the warm pool) until the
// shell lab has want ready unclaimed workspace Pods on the node, and
// returns their session ids.
func fillShellPool(t testing.TB, d *stacktest.Deployment, want int) []string {
	t.Helper()
	var ids []string
	stacktest.Eventually(t, 3*time.Minute, func() (bool, string) {
		rep, err := d.App.Reaper.RunOnce(context.Background(), reap.TriggerSchedule)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Counts[reap.Orphan] != 0 || rep.Counts[reap.Ghost] != 0 {
			t.Fatalf("reaper run took pool Pods for orphans or ghosts: %v %v", rep.Counts, rep.Items)
		}
		ids = nil
		rows, err := d.DB.Query(context.Background(), `SELECT id::text, status FROM sessions
			WHERE lab = 'shell' AND pool = 'idle' AND status IN ('provisioning', 'running') ORDER BY started_at`)
		if err != nil {
			t.Fatal(err)
		}
		starting := 0
		for rows.Next() {
			var id, status string
			if err := rows.Scan(&id, &status); err != nil {
				t.Fatal(err)
			}
			if status == "running" {
				ids = append(ids, id)
			} else {
				starting++
			}
		}
		return len(ids) == want && starting == 0, fmt.Sprintf("shell pool: %d ready, %d starting, want %d ready", len(ids), starting, want)
	})
	return ids
}

// A student's open takes the ready workspace Pod of the shell lab's pool:
// the answer is the pool Pod's session, already running, and the student
// logs in over SSH with their own key at once (delivered into the running
// container, no restart), verifying the session's host key; the Pod's
// containers never restarted. A second student's key does not open it.
func TestWarmPoolPodIsClaimedAndLoggedInto(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{WarmPool: "shell=1"})
	pooled := fillShellPool(t, d, 1)
	before := map[string]int32{}
	row := d.Session(pooled[0])
	idle := &student{t: t, d: d, opened: sessionJSON{ID: row.ID, Nodes: []stacktest.NodeView{{Name: row.Nodes[0].Name}}}}
	for _, cs := range idle.pod().Status.ContainerStatuses {
		before[cs.Name] = cs.RestartCount
	}

	s := openLab(t, d, "pia", "shell", newKey(t))
	if s.opened.ID != pooled[0] || s.opened.Status != "running" {
		t.Fatalf("open = session %s (%s), want the pool's ready %s", s.opened.ID, s.opened.Status, pooled[0])
	}
	s.waitRunning(10 * time.Second)
	took := s.waitSSH(30 * time.Second)
	t.Logf("open answered in %s; first login %s after running", s.runningAt.Sub(s.openedAt), took)
	if got := strings.TrimSpace(s.mustRun("id -u")); got != "0" {
		t.Errorf("logged in as uid %q, want root", got)
	}
	for _, cs := range s.pod().Status.ContainerStatuses {
		if cs.RestartCount != before[cs.Name] {
			t.Errorf("container %s restarted %d times during the claim", cs.Name, cs.RestartCount-before[cs.Name])
		}
	}
	intruder := *s
	intruder.key = newKey(t)
	if _, err := intruder.run("true", nil); err == nil {
		t.Error("a key that is not the student's logged in to the claimed Pod")
	}
	if r := d.Do("GET", "/getSession", d.Token("pia", "student"), "", ""); r.Status != http.StatusOK || r.Session.Student != "pia" {
		t.Errorf("getSession = %d %s", r.Status, r.Body)
	}
	s.close()
}
