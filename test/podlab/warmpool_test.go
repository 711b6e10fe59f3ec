package podlab_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/benchtable"
	"labkeep/localrun/stacktest"
)

// A student's open takes the ready workspace Pod of the shell lab's pool:
// the answer is the pool Pod's session, already running, and the student
// logs in over SSH with their own key at once (delivered into the running
// container, no restart), verifying the session's host key; the Pod's
// containers never restarted. Another key does not open it. When the
// student kills sshd, the restarted container still takes their key.
func TestWarmPoolPodIsClaimedAndLoggedInto(t *testing.T) {
	d := stacktest.Deploy(t, st, stacktest.Options{WarmPool: "shell=1"})
	pooled := d.FillPool("shell", 1, 3*time.Minute)
	before := map[string]int32{}
	row := d.Session(pooled[0])
	idle := &student{t: t, d: d, opened: sessionJSON{ID: row.ID, Nodes: []stacktest.NodeView{{Name: row.Nodes[0].Name}}}}
	for _, cs := range idle.pod().Status.ContainerStatuses {
		before[cs.Name] = cs.RestartCount
	}

	s := openLab(t, d, "pia", "shell", stacktest.NewKey(t))
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
	intruder.key = stacktest.NewKey(t)
	if _, err := intruder.run("true", nil); err == nil {
		t.Error("a key that is not the student's logged in to the claimed Pod")
	}
	if r := d.Do("GET", "/getSession", d.Token("pia", "student"), "", ""); r.Status != http.StatusOK || r.Session.Student != "pia" {
		t.Errorf("getSession = %d %s", r.Status, r.Body)
	}
	// The workspace container restarts when sshd dies; the student's key,
	// which the Pod's Secret does not hold, still lets them in.
	t.Logf("sshd killed → the student logs in again with their key after %s", killSSHD(t, s).Round(10*time.Millisecond))
	s.close()
}

// BenchmarkTableOpenToReadyPoolVsCold: openSession of the shell lab until
// the student's first SSH login succeeds, on the real node, from a ready
// warm pool Pod vs a cold provision (the Pod scheduled, its images
// started, guardian and sshd up). One workspace Pod at a time: the node's
// two CPUs hold one. Both on the wall clock, the same login poll (its
// interval is part of both figures), medians over the samples.
func BenchmarkTableOpenToReadyPoolVsCold(b *testing.B) {
	samples := 5
	if benchtable.Quick() {
		samples = 1
	}
	cold := stacktest.Deploy(b, st, stacktest.Options{Log: stacktest.Discard()})
	warm := stacktest.Deploy(b, st, stacktest.Options{WarmPool: "shell=1", Log: stacktest.Discard()})
	for range b.N {
		var fromPool, fromCold []time.Duration
		for i := range samples {
			// Cold first, while the pool is empty: its Pod needs the CPU
			// a pool Pod would hold.
			fromCold = append(fromCold, openToLogin(b, cold, fmt.Sprintf("cold-%d", i), ""))
			pooled := warm.FillPool("shell", 1, 3*time.Minute)
			fromPool = append(fromPool, openToLogin(b, warm, fmt.Sprintf("warm-%d", i), pooled[0]))
		}
		recordMedians(b, benchtable.Row{
			Group: "Warm pool", Case: "shell lab, workspace Pod on the real node", Figure: "open → first SSH login (median)",
			Baseline: "cold provision of the same lab",
			Note:     fmt.Sprintf("%d samples each; pool %v, cold %v", samples, fromPool, fromCold),
		}, fromPool, fromCold, "pool-ms", "cold-ms")
	}
}

// recordMedians records row with the median of got as its value and the
// median of base as its baseline, in milliseconds, and reports both as
// the metrics gotMetric and baseMetric.
func recordMedians(b *testing.B, row benchtable.Row, got, base []time.Duration, gotMetric, baseMetric string) {
	b.Helper()
	g, c := benchtable.Quantile(got, 0.5), benchtable.Quantile(base, 0.5)
	b.ReportMetric(float64(g.Milliseconds()), gotMetric)
	b.ReportMetric(float64(c.Milliseconds()), baseMetric)
	row.Value, row.Unit, row.BaselineValue = float64(g.Milliseconds()), "ms", benchtable.F(float64(c.Milliseconds()))
	benchtable.Record(b, row)
}

// openToLogin opens the shell lab for name on d and returns the wall time
// until the student's first SSH login with their own key succeeds; the
// session must be want when want is set (a pool instance). The session is
// closed and its objects gone before it returns.
func openToLogin(b *testing.B, d *stacktest.Deployment, name, want string) time.Duration {
	b.Helper()
	start := time.Now()
	s := openLab(b, d, name, "shell", stacktest.NewKey(b))
	if want != "" && s.opened.ID != want {
		b.Fatalf("open = %s, want the pool's %s", s.opened.ID, want)
	}
	s.waitRunning(3 * time.Minute)
	s.waitSSH(time.Minute)
	took := time.Since(start)
	s.close()
	d.WaitGone(s.opened.ID)
	return took
}
