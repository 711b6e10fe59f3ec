package podlab_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/stacktest"
)

// Inside a real workspace Pod, root runs a memory hog and fork bombs while a
// student keeps logging in over SSH. guardian, from its sidecar, kills the
// hog before the kernel's OOM killer would and contains the bombs; the
// workspace container never restarts and every login made meanwhile
// succeeds. The node is
// cgroup v1 and the Pod's root here lacks CAP_SYS_RESOURCE (guardian cannot
// lower oom_score_adj below 0 and says so in an alert).
func TestGuardianKeepsTheWorkspaceUsable(t *testing.T) {
	workload := buildWorkload(t)
	d := stacktest.Deploy(t, st, stacktest.Options{})
	s := openLab(t, d, "erin", "shell", nil)
	s.waitRunning(3 * time.Minute)
	s.upload(workload, "/root/workload")
	pod := s.pod()
	ws := containerID(status(pod, "workspace"))
	memDir, pidsDir := cgroupDir(t, "memory", pod, ws), cgroupDir(t, "pids", pod, ws)
	m := wantLimits(pod).MemoryLimit
	if oc := keyed(t, memDir, "memory.oom_control"); oc["oom_kill_disable"] != 1 {
		t.Errorf("memory.oom_control = %v: guardian did not take over OOM handling", oc)
	}
	noRestart := func(t *testing.T) {
		t.Helper()
		if c := status(s.pod(), "workspace"); c.RestartCount != 0 || containerID(c) != ws {
			t.Errorf("the workspace container restarted: %s", s.podState())
		}
	}

	t.Run("memory hog", func(t *testing.T) {
		s := s.in(t)
		l := s.loginLoop(200 * time.Millisecond)
		// Three processes, each growing 8 MiB every 20 ms towards 400 MiB:
		// 1.2 GiB together, more than the workspace's 1 GiB. They call
		// themselves sshd: a name buys no protection.
		start := time.Now()
		s.mustRun("for i in 1 2 3; do setsid /root/workload hog -mb 400 -step 8 -every 20ms -comm sshd </dev/null >/dev/null 2>&1 & done")
		// Settled: a hog is gone and usage stays below the alert level for
		// a second (a kill may still be under way).
		stable, lastLeft, peak := time.Time{}, -1, uint64(0)
		var settled time.Duration
		stacktest.Eventually(t, time.Minute, func() (bool, string) {
			left := countExe(t, pod, ws, "workload")
			usage, _ := strconv.ParseUint(knob(t, memDir, "memory.usage_in_bytes"), 10, 64)
			peak = max(peak, usage)
			if left == 3 || usage >= m/98*95 || left != lastLeft {
				stable, lastLeft = time.Now(), left
				return false, fmt.Sprintf("%d hogs left, usage %d MiB", left, usage>>20)
			}
			settled = time.Since(start)
			return time.Since(stable) > time.Second, ""
		})
		ok, fail, slowest := l.Finish()
		killed := 3 - lastLeft
		kills := s.records("memory victim killed")
		if len(kills) != killed {
			t.Errorf("guardian logged %d memory kills; %d hogs are gone", len(kills), killed)
		}
		oc := keyed(t, memDir, "memory.oom_control")
		if v, ok := oc["oom_kill"]; !ok || v != 0 {
			t.Errorf("memory.oom_control = %v: the kernel OOM killer fired (or the kernel does not count it)", oc)
		}
		if !slices.Contains(kinds(alerts(t, pod)), "memory-kill") {
			t.Errorf("no memory-kill alert: %v", kinds(alerts(t, pod)))
		}
		noRestart(t)
		if len(fail) > 0 || ok == 0 {
			t.Errorf("logins during the hog: %d ok, %d failed: %v", ok, len(fail), fail)
		}
		var reactions []string
		for _, r := range kills {
			reactions = append(reactions, fmt.Sprintf("%vms (rss %.0f MiB)", r["reaction_ms"], asFloat(r["rss"])/(1<<20)))
		}
		t.Logf("memory hog: %d of 3 hog processes killed by guardian, kernel OOM kills 0, peak usage %d MiB of M = %d MiB; threshold → victim dead %v; settled after %s",
			killed, peak>>20, m*100/98>>20, reactions, settled.Round(10*time.Millisecond))
		t.Logf("logins during the hog: %d ok, %d failed, slowest %s", ok, len(fail), slowest.Round(time.Millisecond))
		s.mustRun("pkill -f ^/root/workload; true")
		stacktest.Eventually(t, 30*time.Second, func() (bool, string) {
			n := countExe(t, pod, ws, "workload")
			return n == 0, fmt.Sprintf("%d hogs left", n)
		})
	})

	// Three bombs, three rounds each: the classic shell bomb, the persistent
	// one that keeps re-spawning its pipeline, and a Go program forking
	// copies of itself.
	// Two students log in again and again from the bomb's start until it is
	// contained, and every one of those logins must succeed.
	bombs := []struct{ name, exe, cmd string }{
		{"shell", "dash", `setsid sh -c 'exec 2>/dev/null; f(){ f | f & }; f' </dev/null >/dev/null 2>&1 &`},
		{"persistent shell", "dash", `setsid sh -c 'exec 2>/dev/null; f(){ while :; do f | f & wait; done; }; f' </dev/null >/dev/null 2>&1 &`},
		{"go", "workload", "setsid /root/workload bomb </dev/null >/dev/null 2>&1 &"},
	}
	const rounds = 3
	for _, b := range bombs {
		for round := 1; round <= rounds; round++ {
			t.Run(fmt.Sprintf("fork bomb %s round %d", b.name, round), func(t *testing.T) {
				s := s.in(t)
				before := len(s.records("containment finished"))
				refusedBefore := keyed(t, pidsDir, "pids.events")["max"]
				loops := []*stacktest.Logins{s.loginLoop(200 * time.Millisecond), s.loginLoop(200 * time.Millisecond)}
				start := time.Now()
				s.mustRun(b.cmd)
				peak := 0
				var contained time.Duration
				stacktest.Eventually(t, 2*time.Minute, func() (bool, string) {
					if c := status(s.pod(), "workspace"); containerID(c) != ws {
						t.Fatalf("the workspace container restarted: %s\nguardian:\n%s\nprevious workspace:\n%s", s.podState(), s.logs("guardian", false), s.logs("workspace", true))
					}
					n := countExe(t, pod, ws, b.exe)
					peak = max(peak, n)
					done := n == 0 && len(s.records("containment finished")) > before
					if done {
						contained = time.Since(start)
					}
					return done, fmt.Sprintf("%d bomb processes, pids.current %s", n, knob(t, pidsDir, "pids.current"))
				})
				ok, slowest := 0, time.Duration(0)
				var fail []string
				for _, l := range loops {
					o, f, sl := l.Finish()
					ok, fail, slowest = ok+o, append(fail, f...), max(slowest, sl)
				}
				if len(fail) > 0 || ok == 0 {
					t.Errorf("logins during the bomb and its containment: %d ok, %d failed: %v\nsshd's log, routine lines left out:\n%s", ok, len(fail), fail, sshdTrouble(s.logs("workspace", false)))
				}
				// Stays contained, and logins work right after.
				s.waitSSH(time.Minute)
				if n := countExe(t, pod, ws, b.exe); n != 0 {
					t.Errorf("the bomb came back: %d processes", n)
				}
				noRestart(t)
				var seen []string
				for _, r := range s.records("fork bomb detected")[before:] {
					at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(r["time"]))
					seen = append(seen, fmt.Sprintf("%s after start: %v, %v processes, %v tasks", at.Sub(start).Round(10*time.Millisecond), r["reason"], r["processes"], r["tasks"]))
				}
				t.Logf("guardian saw the bomb: %v", seen)
				var took []string
				for _, r := range s.records("containment finished")[before:] {
					took = append(took, fmt.Sprintf("%vms/%v killed/%v rounds (freeze %vms, read %vms, signal %vms, thaw %vms, gone %vms; sshd connections protected %v, rounds without the listener %v, sshd executables killed %v)",
						r["took_ms"], r["killed"], r["rounds"], r["freeze_ms"], r["read_ms"], r["signal_ms"], r["thaw_ms"], r["gone_ms"], r["sessions_protected"], r["rounds_without_listener"], r["sshd_exe_killed"]))
				}
				t.Logf("fork bomb (%s, round %d): peak %d processes seen, start → contained %s; guardian freeze-kill-thaw %v; forks refused at pids.max %d (the bomb's during guardian's hold included)",
					b.name, round, peak, contained.Round(10*time.Millisecond), took, keyed(t, pidsDir, "pids.events")["max"]-refusedBefore)
				t.Logf("logins during the bomb: %d ok, %d failed, slowest %s", ok, len(fail), slowest.Round(time.Millisecond))
			})
		}
	}
	if !slices.Contains(kinds(alerts(t, pod)), "fork-bomb") {
		t.Errorf("no fork-bomb alert: %v", kinds(alerts(t, pod)))
	}
	t.Logf("guardian's alerts: %v", alerts(t, pod))
}

// sshdTrouble returns sshd's log without the lines every login and the
// kubelet's TCP probe write, so what went wrong stands out.
func sshdTrouble(log string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		if !strings.HasPrefix(l, "Accepted publickey for ") && !strings.HasPrefix(l, "Connection closed by ") &&
			!strings.HasPrefix(l, "kex_exchange_identification: Connection closed by remote host") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func asFloat(v any) float64 {
	f, _ := v.(float64)
	return f
}
