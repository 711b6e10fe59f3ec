package e2e

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"labkeep/guardian/internal/testcgroup"
)

// A memory hog of several fast-growing processes is killed,
// nothing protected dies, the kernel OOM killer never fires and every login
// succeeds.
func TestMemoryHogIsKilledAndLoginsSucceed(t *testing.T) {
	var m uint64 = 1 << 30
	ws := newWorkspace(t, testcgroup.Limits{MemoryBytes: m, Pids: 512, CPUs: 1})
	g := ws.startGuardian(t.TempDir()+"/state.json", nil)
	since := time.Now()

	// The kernel settings come first.
	limit, _ := strconv.ParseUint(readKnob(t, ws.rel, "memory", "memory.limit_in_bytes"), 10, 64)
	if want := uint64(0.98 * float64(m)); limit > want || limit < want-4096 {
		t.Errorf("memory.limit_in_bytes = %d; want 0.98·M = %d (page-rounded)", limit, want)
	}
	if got := readKnob(t, ws.rel, "pids", "pids.max"); got != "512" {
		t.Errorf("pids.max = %s; want 512", got)
	}
	if ok, read := oomHandedOver(t, ws.rel); !ok {
		t.Errorf("%s: guardian should take over OOM handling", read)
	}

	l := ws.loginLoop(100*time.Millisecond, 10*time.Second)
	time.Sleep(500 * time.Millisecond)

	// Three processes, each growing 8 MiB every 20 ms (400 MiB/s) towards
	// 400 MiB, together 1.2 GiB > M; named "sshd" to show the name buys
	// nothing.
	var hogs []*proc
	hogStart := time.Now()
	for i := 0; i < 3; i++ {
		hogs = append(hogs, ws.user(bins.workload, "hog", "-mb", "400", "-step", "8", "-every", "20ms", "-comm", "sshd"))
	}
	// Wait until guardian has killed enough for the survivors to fit:
	// usage back below the alert threshold with at least one hog gone.
	// It must hold for a second: a kill may still be under way.
	stableSince, lastGone := time.Time{}, -1
	settled := eventually(30*time.Second, func() bool {
		gone := 0
		for _, h := range hogs {
			if !h.alive() {
				gone++
			}
		}
		u, _ := strconv.ParseUint(readKnob(t, ws.rel, "memory", "memory.usage_in_bytes"), 10, 64)
		if gone == 0 || u >= uint64(0.95*float64(m)) || gone != lastGone {
			stableSince, lastGone = time.Now(), gone
			return false
		}
		return time.Since(stableSince) > time.Second
	})
	if !settled {
		t.Errorf("memory never settled: usage %s", readKnob(t, ws.rel, "memory", "memory.usage_in_bytes"))
	}
	killed := 0
	var deaths []time.Duration
	for _, h := range hogs {
		if h.alive() {
			continue
		}
		if sig, ok := h.killedBySignal(); ok {
			killed++
			deaths = append(deaths, h.ended.Sub(hogStart).Round(time.Millisecond))
			t.Logf("hog pid %d killed by %v", h.cmd.Process.Pid, sig)
		} else {
			t.Errorf("hog pid %d exited by itself: %v\n%s", h.cmd.Process.Pid, h.state, h.stderr.String())
		}
	}
	if killed == 0 {
		t.Fatal("no hog process was killed")
	}
	time.Sleep(time.Second)
	lat, failures := l.finish()

	if n := len(g.records("memory victim killed")); n != killed {
		t.Errorf("guardian reports %d memory kills; %d hog processes died by a signal", n, killed)
	}
	if !ws.stillSame(ws.sshd.id) || !ws.stillSame(ws.init.id) {
		t.Errorf("a protected process died: sshd alive %v, init alive %v", ws.stillSame(ws.sshd.id), ws.stillSame(ws.init.id))
	}
	if oc := keyed(t, ws.rel, "memory", "memory.oom_control"); oc["oom_kill"] != 0 {
		t.Errorf("the kernel OOM killer fired: %v", oc)
	}
	if len(failures) > 0 {
		t.Errorf("%d of %d logins failed: %v\nsshd: %s", len(failures), len(failures)+len(lat), failures, ws.sshd.stderr.String())
	}
	if len(lat) < 5 {
		t.Errorf("only %d logins happened during the scenario", len(lat))
	}
	if _, ok := g.hasAlert("memory-kill"); !ok {
		t.Errorf("no memory-kill alert in %v", g.alerts())
	}
	var reactions []string
	for _, r := range g.records("memory victim killed") {
		reactions = append(reactions, fmt.Sprintf("%vms (sigkill=%v under_oom=%v rss=%.0fMiB)", r["reaction_ms"], r["sigkill"], r["under_oom"], r["rss"].(float64)/(1<<20)))
	}
	t.Logf("memory: %d hog processes killed; threshold crossed → victim dead: %v; hog start → deaths: %v", killed, reactions, deaths)
	t.Logf("logins during the hog: %d ok, %d failed, latency p50 %v p95 %v max %v", len(lat), len(failures), percentile(lat, 0.5), percentile(lat, 0.95), percentile(lat, 1))
	g.report(since)
}
