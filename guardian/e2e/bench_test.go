package e2e

import (
	"testing"
	"time"

	"labkeep/guardian/internal/testcgroup"
)

// The speed targets live here, not in the tests: run with
// go test ./guardian/e2e -run '^$' -bench . -benchtime 5x

// BenchmarkMemoryReaction: memory threshold crossed → victim dead, as
// guardian measures it (eventfd notification to the victim's exit).
func BenchmarkMemoryReaction(b *testing.B) {
	ws := newWorkspace(b, testcgroup.Limits{MemoryBytes: 1 << 30, Pids: 512, CPUs: 1})
	g := ws.startGuardian(b.TempDir()+"/state.json", map[string]string{"GUARDIAN_KILL_MAX": "1000"})
	var total float64
	for i := 0; b.Loop(); i++ {
		hog := ws.user(bins.workload, "hog", "-mb", "1100", "-step", "8", "-every", "20ms")
		select {
		case <-hog.done:
		case <-time.After(30 * time.Second):
			b.Fatal("hog not killed")
		}
		var recs []map[string]any
		if !eventually(5*time.Second, func() bool { recs = g.records("memory victim killed"); return len(recs) > i }) {
			b.Fatalf("guardian logged %d kills after %d hogs; hog: %v %s\n%s", len(recs), i+1, hog.state, hog.stderr.String(), g.logs.String())
		}
		total += recs[len(recs)-1]["reaction_ms"].(float64)
		time.Sleep(200 * time.Millisecond)
	}
	b.ReportMetric(total/float64(b.N), "ms/reaction")
}

// BenchmarkForkBombContainment: bomb start → every bomb process gone.
func BenchmarkForkBombContainment(b *testing.B) {
	ws := newWorkspace(b, testcgroup.Limits{MemoryBytes: 1 << 30, Pids: 1024, CPUs: 1})
	g := ws.startGuardian(b.TempDir()+"/state.json", nil)
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		bomb := ws.user("/bin/sh", "-c", shellBomb)
		if !eventually(60*time.Second, func() bool {
			return !bomb.alive() && len(g.records("containment finished")) > i && countExe(ws, "/usr/bin/dash") == 0
		}) {
			b.Fatalf("bomb not contained: %d bomb processes, bomb root %v", countExe(ws, "/usr/bin/dash"), bomb.state)
		}
		total += time.Since(start)
		// Killed orphans are reaped by the host's init; their pids count
		// until then. Start the next bomb on a settled workspace.
		b.StopTimer()
		eventually(30*time.Second, func() bool { return knobInt(b, ws.rel, "pids", "pids.current") <= 4 })
		time.Sleep(time.Second)
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/containment")
}

// BenchmarkLoginUnderCPUStorm: login latency with guardian while spinners
// saturate the workspace's CPU quota.
func BenchmarkLoginUnderCPUStorm(b *testing.B) {
	ws := newWorkspace(b, testcgroup.Limits{MemoryBytes: 1 << 30, Pids: 512, CPUs: 1})
	ws.startGuardian(b.TempDir()+"/state.json", nil)
	for i := 0; i < 4; i++ {
		ws.user(bins.workload, "spin")
	}
	time.Sleep(time.Second)
	var total time.Duration
	for b.Loop() {
		took, err := ws.login(20 * time.Second)
		if err != nil {
			b.Fatal(err)
		}
		total += took
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/login")
}

// BenchmarkGuardianIdle: guardian's own CPU and memory while it watches a
// quiet workspace with the production periods (one op = one second).
func BenchmarkGuardianIdle(b *testing.B) {
	ws := newWorkspace(b, testcgroup.Limits{MemoryBytes: 1 << 30, Pids: 512, CPUs: 1})
	defaults := map[string]string{}
	for k := range fastEnv() {
		defaults[k] = "" // back to guardian's defaults
	}
	g := ws.startGuardian(b.TempDir()+"/state.json", defaults)
	cpu0, _, _ := g.usage()
	for b.Loop() {
		time.Sleep(time.Second)
	}
	cpu1, rss, _ := g.usage()
	b.ReportMetric(float64((cpu1-cpu0).Milliseconds())/float64(b.N), "cpu-ms/s")
	b.ReportMetric(float64(rss)/(1<<20), "RSS-MiB")
}
