package e2e

import (
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"labkeep/guardian/internal/testcgroup"
	"labkeep/guardian/sched"
)

// Under a CPU storm (64 spinners on a quota of one and a half cores, half
// of them trying to renice themselves to -20) the user cannot renice,
// sshd's listener (and only it) runs SCHED_RR, guardian demotes the
// spinners to SCHED_IDLE, high CPU alone kills nothing, and with guardian
// every login succeeds within stormLoginBound. The test reports each
// login without and with guardian; how much faster is
// BenchmarkLoginUnderCPUStorm's figure, not a test's. That the storm
// starves logins without guardian is not asserted: it holds here (median
// 2.8–3.3 s without, at most 0.9–1.0 s with) but not yet in the emulated
// v2 guest, where with guardian a login still takes up to 13–18 s now and
// then against a median of 8 s without.
func TestCPUStormLoginLatency(t *testing.T) {
	ws := newWorkspace(t, stormLimits)
	spinners := stormSpinners
	const logins = 10

	storm := func(label string) (lat []time.Duration, failures []string, spin []*proc) {
		t.Helper()
		for i := 0; i < spinners; i++ {
			args := []string{"spin"}
			if i%2 == 1 {
				args = append(args, "-nice", "-20")
			}
			spin = append(spin, ws.user(bins.workload, args...))
		}
		time.Sleep(scaled(time.Second))
		var each []string
		for i := 0; i < logins; i++ {
			took, err := ws.login(20 * time.Second)
			if err != nil {
				failures = append(failures, err.Error())
			} else {
				lat = append(lat, took)
			}
			each = append(each, took.Round(time.Millisecond).String())
		}
		t.Logf("%s: logins in order: %v", label, each)
		t.Logf("%s: %d spinners, %d logins: p50 %v p95 %v max %v, %d failed %v",
			label, spinners, logins, percentile(lat, 0.5), percentile(lat, 0.95), percentile(lat, 1), len(failures), failures)
		return lat, failures, spin
	}
	stop := func(spin []*proc) {
		for _, s := range spin {
			s.cmd.Process.Kill()
			<-s.done
		}
	}

	idle := []time.Duration{}
	for i := 0; i < 5; i++ {
		if took, err := ws.login(5 * time.Second); err == nil {
			idle = append(idle, took)
		}
	}
	t.Logf("idle workspace: login p50 %v", percentile(idle, 0.5))

	without, _, spin := storm("without guardian")
	for i, s := range spin {
		if i%2 == 1 && !strings.Contains(s.stderr.String(), "refused") {
			t.Errorf("spinner %d could renice itself to -20 without CAP_SYS_NICE: %q", i, s.stderr.String())
		}
	}
	stop(spin)

	g := ws.startGuardian(t.TempDir()+"/state.json", nil)
	since := time.Now()
	// v1 only: v2 has no real-time group budget (RT tasks run in the root).
	if !onV2() && readKnob(t, ws.rel, "cpu", "cpu.rt_runtime_us") == "0" {
		t.Errorf("cpu.rt_runtime_us = 0: guardian did not grant the workspace a real-time budget")
	}
	var attr sched.Attr
	if !eventually(5*time.Second, func() bool { attr, _ = sched.Get(ws.sshd.id.PID); return attr.IsRR(1) }) {
		t.Errorf("sshd listener scheduling = %+v; want SCHED_RR priority 1 with reset-on-fork", attr)
	}
	with, failures, spin := storm("with guardian")
	alive, demoted := 0, 0
	for _, s := range spin {
		if s.alive() {
			alive++
		}
		if a, err := sched.Get(s.cmd.Process.Pid); err == nil && a.Policy == unix.SCHED_IDLE {
			demoted++
		}
	}
	if alive != spinners {
		t.Errorf("%d of %d spinners died: high CPU alone must never kill", spinners-alive, spinners)
	}
	if hang, hung := g.hasAlert("cpu-hang"); hung {
		t.Errorf("guardian saw a hang although it keeps SSH usable: %q", hang.Message)
	}
	if demoted != spinners {
		t.Errorf("%d of %d spinners run at SCHED_IDLE during the storm; want all", demoted, spinners)
	}
	if _, ok := g.hasAlert("cpu-storm"); !ok {
		t.Errorf("no cpu-storm alert in %v", g.alerts())
	}
	if len(failures) > 0 {
		t.Errorf("%d logins failed with guardian: %v", len(failures), failures)
	}
	if slowest := percentile(with, 1); slowest > scaled(stormLoginBound) {
		t.Errorf("with guardian the slowest login took %v, above %v", slowest, scaled(stormLoginBound))
	}

	// A login forks: the child must not inherit real-time priority.
	for _, pid := range testcgroup.Procs(ws.rel) {
		if pid == ws.sshd.id.PID {
			continue
		}
		if a, err := sched.Get(pid); err == nil && a.Policy == unix.SCHED_RR {
			t.Errorf("pid %d runs SCHED_RR: only the listener may", pid)
		}
	}
	stop(spin)
	t.Logf("login latency under CPU storm: without guardian p50 %v / max %v; with guardian p50 %v / max %v; idle p50 %v",
		percentile(without, 0.5), percentile(without, 1), percentile(with, 0.5), percentile(with, 1), percentile(idle, 0.5))
	g.report(since)
}

// stormLoginBound is the most a login may take during a CPU storm with
// guardian (scaled in an emulated guest): generous, five times the slowest
// seen here.
const stormLoginBound = 5 * time.Second

// stormLimits is the workspace of the CPU storm scenarios: production
// pids.max, a quota of one and a half cores.
var stormLimits = testcgroup.Limits{MemoryBytes: 1 << 30, Pids: 4096, CPUs: 1.5}

// stormSpinners is how many spinners make the storm: 64, or 16 in an
// emulated guest (see emulated), where 64 spinners without guardian make
// each login take about a minute.
var stormSpinners = map[bool]int{false: 64, true: 16}[emulated()]
