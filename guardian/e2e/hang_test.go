package e2e

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"labkeep/guardian/internal/testcgroup"
)

// The CPU escalation on the real kernel: spinners saturate the workspace's
// CPU quota while SSH is unreachable (the user stopped sshd with SIGSTOP;
// the protector, which would continue it, runs only at start here). Scaled
// periods: alert 2s, top-1 4s, top-3 6s, all 8s.
func TestCPUHangEscalates(t *testing.T) {
	// Half a CPU of quota: reachable even when other work loads this
	// 2-core machine, so the workspace really sits at its quota. pids.max
	// is production's: at 256 the spinners' 33 tasks (Go threads) were an
	// eighth of it, and on the emulated CPU of test/guardianvm, which
	// starts them one by one, they grew at each look with 9 of 14
	// processes orphans, which is a bomb by guardian's rule at that limit.
	ws := newWorkspace(t, testcgroup.Limits{MemoryBytes: 1 << 30, Pids: 4096, CPUs: 0.5})
	g := ws.startGuardian(t.TempDir()+"/state.json", map[string]string{"GUARDIAN_PROTECT_EVERY": "1h", "GUARDIAN_HANG_RECOVERY": "5s"})
	since := time.Now()
	var spin []*proc
	for i := 0; i < 6; i++ {
		spin = append(spin, ws.user(bins.workload, "spin"))
	}
	stop := ws.user("/bin/kill", "-STOP", strconv.Itoa(ws.sshd.id.PID))
	<-stop.done
	start := time.Now()
	t.Cleanup(func() { ws.user("/bin/kill", "-CONT", strconv.Itoa(ws.sshd.id.PID)) })

	alive := func() int {
		n := 0
		for _, s := range spin {
			if s.alive() {
				n++
			}
		}
		return n
	}
	// Record when the number of live spinners changes.
	var steps []string
	last := len(spin)
	if !eventually(40*time.Second, func() bool {
		if n := alive(); n != last {
			steps = append(steps, strconv.Itoa(last-n)+" killed at "+time.Since(start).Round(100*time.Millisecond).String())
			last = n
		}
		return last == 0
	}) {
		resp, _ := http.Get(g.api + "/metrics")
		body, _ := io.ReadAll(resp.Body)
		var m []string
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, "guardian_") {
				m = append(m, l)
			}
		}
		t.Fatalf("spinners still running after 40s: %d; steps %v; alerts %v\nmetrics %v", alive(), steps, g.alerts(), m)
	}
	if len(steps) < 2 {
		t.Errorf("escalation in %d step(s) %v; want the top-1, top-3, all progression", len(steps), steps)
	}
	a, ok := g.hasAlert("cpu-hang")
	if !ok {
		t.Errorf("no cpu-hang alert: %v", g.alerts())
	}
	if !ws.stillSame(ws.sshd.id) || !ws.stillSame(ws.init.id) {
		t.Error("a protected process was killed in the escalation")
	}
	t.Logf("hang escalation (CPU at quota, sshd stopped): %v; alert %q (count %d)", steps, a.Message, a.Count)
	g.report(since)
}

// A user who stops sshd (SIGSTOP, same uid) does not lock themselves out:
// the protector continues it.
func TestStoppedSSHDIsContinued(t *testing.T) {
	ws := newWorkspace(t, testcgroup.Limits{MemoryBytes: 256 << 20, Pids: 256, CPUs: 1})
	g := ws.startGuardian(t.TempDir()+"/state.json", nil)
	stop := ws.user("/bin/kill", "-STOP", strconv.Itoa(ws.sshd.id.PID))
	<-stop.done
	stopped := time.Now()
	if !eventually(10*time.Second, func() bool { _, err := ws.login(2 * time.Second); return err == nil }) {
		t.Fatalf("sshd stayed stopped: %v", g.alerts())
	}
	if _, ok := g.hasAlert("protected-stopped"); !ok {
		t.Errorf("no protected-stopped alert: %v", g.alerts())
	}
	t.Logf("sshd stopped → login works again after %v (protector period 1s)", time.Since(stopped).Round(time.Millisecond))
}
