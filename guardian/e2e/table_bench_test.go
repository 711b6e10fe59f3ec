package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"labkeep/guardian/guard"
	"labkeep/guardian/internal/testcgroup"
	"labkeep/localrun/benchtable"
)

// The table benchmarks of `make bench` (run with -benchtime 1x; each loops
// by itself): every figure beside its baseline measured in the same run,
// recorded through benchtable. They reuse the scenarios above on the real
// kernel of this machine.

// tableCase names the kernel the figures come from. This machine's is
// cgroup v1; cgroup v2 runs only in test/guardianvm's emulated (TCG)
// guest, too slow for make bench's budget, whose table benchmark runs
// these there when LABKEEP_BENCH_V2=1.
func tableCase(what string) string {
	v := "cgroup v1"
	if onV2() {
		v = "cgroup v2, emulated (TCG) guest"
	}
	return fmt.Sprintf("%s, %s", what, v)
}

// record records r, its note saying where cgroup v2's figures are when
// they are not in this run.
func record(b *testing.B, r benchtable.Row) {
	b.Helper()
	if !onV2() {
		r.Note = strings.TrimPrefix(r.Note+"; cgroup v2 only in the emulated guest: LABKEEP_BENCH_V2=1", "; ")
	}
	benchtable.Record(b, r)
}

// BenchmarkTableGuardianMemory: memory threshold (killLevel) crossed →
// victim dead, guardian woken by the kernel's threshold notifications against
// the same guardian in its fallback of polling every 2 s (its mode when
// notifications cannot be registered, forced here by making
// cgroup.event_control unwritable to it). The crossing is read outside
// guardian, from the cgroup's usage every millisecond, so the polling
// delay counts; guardian's own reaction_ms starts when it first sees the
// crossing.
func BenchmarkTableGuardianMemory(b *testing.B) {
	hogs, m := 5, uint64(1<<30)
	if benchtable.Quick() {
		hogs, m = 1, 256<<20
	}
	for range b.N {
		event, eventOwn := memoryReactions(b, false, hogs, m)
		var poll []time.Duration
		var pollOwn []float64
		if !onV2() {
			poll, pollOwn = memoryReactions(b, true, hogs, m)
		}
		frac, level := killLevel()
		c := tableCase(fmt.Sprintf("%d hogs growing 400 MiB/s to 1.1·M, M = %d MiB, threshold %.2f·M (%s)", hogs, m>>20, frac, level))
		for _, q := range []struct {
			name string
			q    float64
		}{{"p50", 0.5}, {"max", 1}} {
			r := benchtable.Row{
				Group: "guardian: memory", Case: c, Figure: "threshold → victim dead " + q.name + ", kernel notifications",
				Value: ms(percentile(event, q.q)), Unit: "ms",
				Baseline: "guardian polling every 2 s (notifications unavailable)",
				Note:     fmt.Sprintf("guardian's own reaction_ms (from when it saw the crossing): %v notified, %v polling", eventOwn, pollOwn),
			}
			if onV2() {
				r.Why = "on cgroup v2 the notifications are inotify on memory.events, which guardian also reads for its counters: they cannot be taken away alone"
			} else {
				r.BaselineValue = benchtable.F(ms(percentile(poll, q.q)))
			}
			record(b, r)
		}
	}
}

// killLevel is the usage, as a fraction of M, from which guardian kills a
// growing hog, and its name. On v1 that is the kill level; on v2
// memory.high (below it) throttles the hog first, and guardian kills once
// it is throttled at the alert level.
func killLevel() (float64, string) {
	if onV2() {
		return guard.Defaults().AlertFraction, "alert level, throttled at memory.high"
	}
	return guard.Defaults().KillFraction, "kill level"
}

// memoryReactions runs n hogs one after another in a fresh workspace of
// memory limit m under guardian with its production memory poll (2 s),
// with the kernel's notifications or, polling (cgroup v1 only), without
// them, and returns each crossing → death and guardian's own reaction_ms.
func memoryReactions(b *testing.B, polling bool, n int, m uint64) (reactions []time.Duration, own []float64) {
	ws := newWorkspace(b, testcgroup.Limits{MemoryBytes: m, Pids: 512, CPUs: 1})
	if polling {
		ctl := filepath.Join(testcgroup.Dir(ws.rel, "memory"), "cgroup.event_control")
		if err := os.Chmod(ctl, 0o444); err != nil {
			b.Fatal(err)
		}
	}
	g := ws.startGuardian(b.TempDir()+"/state.json", map[string]string{"GUARDIAN_KILL_MAX": "1000", "GUARDIAN_MEMORY_POLL": ""})
	const fallback = "memory notifications unavailable, polling only"
	if !eventually(5*time.Second, func() bool { return len(g.records(fallback)) > 0 == polling }) || (!polling && len(g.records(fallback)) > 0) {
		b.Fatalf("guardian polling only = %v, want %v\n%s", len(g.records(fallback)) > 0, polling, g.logs.String())
	}
	frac, _ := killLevel()
	kill := uint64(frac * float64(ws.lim.MemoryBytes))
	usage := filepath.Join(testcgroup.Dir(ws.rel, "memory"), knobFile(b, "memory.usage_in_bytes"))
	for i := range n {
		w := watchCrossing(usage, kill)
		hog := ws.user(bins.workload, "hog", "-mb", strconv.FormatUint(m*11/10>>20, 10), "-step", "8", "-every", "20ms")
		select {
		case <-hog.done:
		case <-time.After(scaled(30 * time.Second)):
			b.Fatal("hog not killed")
		}
		crossed := w.stop()
		if _, ok := hog.killedBySignal(); !ok || crossed.IsZero() {
			b.Fatalf("hog: %v, crossing seen at %v\n%s", hog.state, crossed, g.logs.String())
		}
		reactions = append(reactions, hog.ended.Sub(crossed))
		var recs []map[string]any
		if !eventually(5*time.Second, func() bool { recs = g.records("memory victim killed"); return len(recs) > i }) {
			b.Fatalf("guardian logged %d kills after %d hogs\n%s", len(recs), i+1, g.logs.String())
		}
		own = append(own, recs[len(recs)-1]["reaction_ms"].(float64))
		// The next hog starts from a quiet workspace.
		if !eventually(10*time.Second, func() bool { u, err := readUint(usage); return err == nil && u < kill/2 }) {
			b.Fatal("memory never came back down after the kill")
		}
		time.Sleep(200 * time.Millisecond)
	}
	return reactions, own
}

// crossingWatch reads a usage file every millisecond until it first
// reaches a threshold.
type crossingWatch struct {
	mu      sync.Mutex
	crossed time.Time
	quit    chan struct{}
	done    chan struct{}
}

func watchCrossing(file string, threshold uint64) *crossingWatch {
	w := &crossingWatch{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			if u, err := readUint(file); err == nil && u >= threshold {
				w.mu.Lock()
				w.crossed = time.Now()
				w.mu.Unlock()
				return
			}
			select {
			case <-w.quit:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return w
}

// stop ends the watch and returns when the threshold was first reached
// (zero if never).
func (w *crossingWatch) stop() time.Time {
	close(w.quit)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.crossed
}

func readUint(file string) (uint64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// BenchmarkTableGuardianForkBomb: fork bomb start → no bomb process left,
// and the logins (every 200 ms) that succeed meanwhile, with guardian
// against the kernel's pids.max alone, in the same run. A bomb the kernel
// does not stop counts as contained at the cap.
func BenchmarkTableGuardianForkBomb(b *testing.B) {
	limit, rounds := bombCap, 2
	note := "without guardian a bomb never contained counts %s"
	bombs := []struct{ name, script string }{
		{"classic shell bomb", classicShellBomb},
		{"persistent shell bomb", shellBomb},
	}
	if benchtable.Quick() {
		limit, rounds, bombs = 3*time.Second, 1, bombs[1:]
		note = "quick: " + note
	}
	for range b.N {
		for _, v := range bombs {
			var without, with bombRun
			for range rounds {
				ws := newWorkspace(b, bombLimits)
				without.add(bombCapped(ws, v.script, limit))
				ws.startGuardian(b.TempDir()+"/state.json", defaultForkScan)
				if !eventually(bombCap, func() bool { return countExe(ws, "/usr/bin/dash") == 0 }) {
					b.Fatal("guardian did not clear what the bomb left without it")
				}
				time.Sleep(time.Second)
				with.add(bombCapped(ws, v.script, limit))
			}
			c := tableCase(fmt.Sprintf("%s, pids.max %d, %d rounds", v.name, bombLimits.Pids, rounds))
			kernel := "the kernel's pids.max alone (no guardian)"
			record(b, benchtable.Row{
				Group: "guardian: fork bomb", Case: c, Figure: "bomb start → contained, mean", Value: ms(with.contained / time.Duration(rounds)), Unit: "ms",
				Baseline: kernel, BaselineValue: benchtable.F(ms(without.contained / time.Duration(rounds))), Note: fmt.Sprintf(note, scaled(limit)),
			})
			record(b, benchtable.Row{
				Group: "guardian: fork bomb", Case: c, Figure: "logins ok during the bomb", Value: okPercent(with), Unit: "%",
				Baseline: kernel, BaselineValue: benchtable.F(okPercent(without)),
				Note: fmt.Sprintf("with guardian %d/%d, without %d/%d", with.ok, with.ok+with.failed, without.ok, without.ok+without.failed),
			})
		}
	}
}

// okPercent is the share of r's logins that succeeded.
func okPercent(r bombRun) float64 {
	if r.ok+r.failed == 0 {
		return 0
	}
	return 100 * float64(r.ok) / float64(r.ok+r.failed)
}

// BenchmarkTableGuardianCPUStorm: SSH login latency while stormSpinners
// spinners saturate the workspace, with a quota of 1.5 cores and with
// none (the whole machine), with guardian against without, in the same
// workspace and run. The spinners run at nice 0, the highest priority
// the workspace's root can set (it has no CAP_SYS_NICE).
func BenchmarkTableGuardianCPUStorm(b *testing.B) {
	logins := 20
	if benchtable.Quick() {
		logins = 2
	}
	for range b.N {
		for _, quota := range []struct {
			cpus float64
			name string
		}{{stormLimits.CPUs, "CPU quota 1.5 cores"}, {0, "no CPU quota"}} {
			lim := stormLimits
			lim.CPUs = quota.cpus
			cpuStormRows(b, lim, fmt.Sprintf("%d spinners, %s, %d logins each way", stormSpinners, quota.name, logins), logins)
		}
	}
}

// cpuStormRows measures one storm case of BenchmarkTableGuardianCPUStorm
// and records its rows.
func cpuStormRows(b *testing.B, lim testcgroup.Limits, name string, logins int) {
	b.Helper()
	ws := newWorkspace(b, lim)
	stop := func(spin []*proc) {
		for _, s := range spin {
			s.cmd.Process.Kill()
			<-s.done
		}
	}
	without, withoutFailed, spin := stormLogins(ws, 2*time.Second, logins)
	stop(spin)
	ws.startGuardian(b.TempDir()+"/state.json", nil)
	// Two storm looks: the first is the baseline.
	with, withFailed, spin := stormLogins(ws, 2*time.Second+2*guard.Defaults().StormEvery, logins)
	stop(spin)
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p99", 0.99}} {
		record(b, benchtable.Row{
			Group: "guardian: CPU storm", Case: tableCase(name), Figure: "SSH login " + q.name, Value: ms(percentile(with, q.q)), Unit: "ms",
			Baseline: "the same storm without guardian", BaselineValue: benchtable.F(ms(percentile(without, q.q))),
			Note: fmt.Sprintf("a failed login counts 20 s; failed: with guardian %d/%d, without %d/%d", withFailed, logins, withoutFailed, logins),
		})
	}
}

// BenchmarkTableGuardianLoad: guardian's own CPU (percent of one core)
// and RSS with its production periods while the workspace holds 1,000
// sleeping processes, against the same with about ten (init, sshd, eight
// sleepers), each in a workspace of its own; the processes exist before
// guardian starts and the window starts 2 s after it answers.
func BenchmarkTableGuardianLoad(b *testing.B) {
	window, busy := 30*time.Second, 1000
	if benchtable.Quick() {
		window, busy = 2*time.Second, 100
	}
	for range b.N {
		idleCPU, idleRSS, idleProcs := guardianLoad(b, 8, window)
		busyCPU, busyRSS, busyProcs := guardianLoad(b, busy, window)
		c := tableCase(fmt.Sprintf("%d processes in the workspace, production periods, %s window", busyProcs, window))
		base := fmt.Sprintf("the same guardian over a workspace of %d processes", idleProcs)
		note := ""
		if raceEnabled {
			note = "race detector on: inflated"
		}
		record(b, benchtable.Row{Group: "guardian: own cost", Case: c, Figure: "guardian CPU, % of one core", Value: busyCPU, Unit: "%",
			Baseline: base, BaselineValue: benchtable.F(idleCPU), Note: note})
		record(b, benchtable.Row{Group: "guardian: own cost", Case: c, Figure: "guardian RSS", Value: busyRSS, Unit: "MiB",
			Baseline: base, BaselineValue: benchtable.F(idleRSS), Note: note})
	}
}

// guardianLoad starts extra sleeping processes in a fresh workspace, then
// guardian with its production periods, and returns guardian's CPU (% of
// one core) over window, its RSS at the end and how many processes the
// workspace held.
func guardianLoad(b *testing.B, extra int, window time.Duration) (cpuPct, rssMiB float64, procs int) {
	ws := newWorkspace(b, testcgroup.Limits{MemoryBytes: 1 << 30, Pids: 4096, CPUs: 1})
	if extra > 0 {
		ws.user("/bin/sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do sleep 100000 & i=$((i+1)); done; wait", extra))
		if !eventually(time.Minute, func() bool { return countExe(ws, "/usr/bin/sleep") >= extra }) {
			b.Fatalf("%d of %d sleepers started", countExe(ws, "/usr/bin/sleep"), extra)
		}
	}
	g := ws.startGuardian(b.TempDir()+"/state.json", productionPeriods())
	time.Sleep(2 * time.Second)
	cpu0, _, _ := g.usage()
	start := time.Now()
	time.Sleep(window)
	cpu1, rss, _ := g.usage()
	wall := time.Since(start)
	procs = len(testcgroup.Procs(ws.rel))
	if extra > 0 && procs < extra {
		b.Fatalf("the workspace holds %d processes after the window, want at least %d: guardian killed some\n%s", procs, extra, g.logs.String())
	}
	return 100 * (cpu1 - cpu0).Seconds() / wall.Seconds(), float64(rss) / (1 << 20), procs
}
