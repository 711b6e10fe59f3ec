package e2e

import (
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"labkeep/guardian/internal/testcgroup"
	"labkeep/guardian/sched"
)

// When guardian is killed and restarted, the limits stay, and the
// restarted guardian takes up its state: the same M (not 0.98·0.98·M), the
// alerts raised before, and it handles what happened while it was down.
func TestGuardianRestartKeepsLimitsAndState(t *testing.T) {
	var m uint64 = 256 << 20
	ws := newWorkspace(t, testcgroup.Limits{MemoryBytes: m, Pids: 256, CPUs: 1})
	state := t.TempDir() + "/state.json"
	// No GUARDIAN_MEMORY_LIMIT: guardian takes M from the cgroup at its
	// first start and must remember it.
	g := ws.startGuardian(state, map[string]string{"GUARDIAN_MEMORY_LIMIT": ""})
	since := time.Now()

	wantLimit := strconv.FormatUint(uint64(0.98*float64(m))/4096*4096, 10)
	knobs := func() map[string]string {
		handed, oom := oomHandedOver(t, ws.rel)
		k := map[string]string{
			"limit":  readKnob(t, ws.rel, "memory", "memory.limit_in_bytes"),
			"pids":   readKnob(t, ws.rel, "pids", "pids.max"),
			"oom":    oom,
			"handed": strconv.FormatBool(handed),
			"soft":   readKnob(t, ws.rel, "memory", "memory.soft_limit_in_bytes"),
			"rt":     "none on v2", // v2 has no real-time group budget
		}
		if !onV2() {
			k["rt"] = readKnob(t, ws.rel, "cpu", "cpu.rt_runtime_us")
		}
		return k
	}
	if !eventually(5*time.Second, func() bool { a, _ := sched.Get(ws.sshd.id.PID); return a.IsRR(1) }) {
		t.Fatal("sshd never got SCHED_RR")
	}
	before := knobs()
	if before["limit"] != wantLimit || before["pids"] != "256" || before["handed"] != "true" || before["rt"] == "0" {
		t.Fatalf("kernel settings after start = %v; want limit %s, pids 256, OOM handed to guardian, an RT budget (v1)", before, wantLimit)
	}
	// Something to remember: a cleanup alert.
	if code, body := g.cleanup(cleanupToken); code != 200 {
		t.Fatalf("cleanup = %d %s", code, body)
	}

	g.kill()
	if after := knobs(); !equal(after, before) {
		t.Errorf("killing guardian changed the kernel settings: %v → %v", before, after)
	}
	if a, _ := sched.Get(ws.sshd.id.PID); !a.IsRR(1) {
		t.Errorf("sshd lost SCHED_RR when guardian died: %+v", a)
	}

	// While guardian is down, a hog reaches the limit: with the OOM
	// decision handed to guardian it is held there (v1: waits under OOM;
	// v2: throttled at memory.high) instead of killing anything.
	hog := ws.user(bins.workload, "hog", "-mb", "400", "-step", "8", "-every", "5ms")
	if !eventually(10*time.Second, func() bool { return heldAtLimit(t, ws.rel) }) {
		t.Fatalf("the hog never reached the limit: %v", keyed(t, ws.rel, "memory", "memory.oom_control"))
	}
	restartAt := time.Now()
	g.start()
	select {
	case <-hog.done:
		t.Logf("restart → waiting hog dead: %v", hog.ended.Sub(restartAt).Round(time.Millisecond))
	case <-time.After(scaled(15 * time.Second)):
		t.Fatal("the restarted guardian did not resolve the OOM left while it was down")
	}
	if after := knobs(); !equal(after, before) {
		t.Errorf("the restart changed the kernel settings: %v → %v (M must be remembered, not re-read from the lowered limit)", before, after)
	}
	if _, ok := g.hasAlert("cleanup"); !ok {
		t.Errorf("the alerts from before the restart are gone: %v", g.alerts())
	}
	var st struct {
		MemoryLimit uint64 `json:"memory_limit"`
		Starts      int    `json:"starts"`
	}
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil || st.MemoryLimit != m || st.Starts != 2 {
		t.Errorf("state = %+v (%v); want memory_limit %d and 2 starts", st, err, m)
	}
	if keyed(t, ws.rel, "memory", "memory.oom_control")["oom_kill"] != 0 {
		t.Error("the kernel OOM killer fired")
	}
	if !ws.stillSame(ws.sshd.id) || !ws.stillSame(ws.init.id) {
		t.Error("a protected process died")
	}
	if _, err := ws.login(5 * time.Second); err != nil {
		t.Errorf("login after the restart: %v", err)
	}
	g.report(since)
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
