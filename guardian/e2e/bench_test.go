package e2e

import (
	"testing"
	"time"

	"labkeep/guardian/guard"
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

// BenchmarkLoginUnderCPUStorm: login latency and success while 64
// spinners saturate a quota of one and a half cores, without guardian and
// with it, in the same run; p99-x is how many times better guardian's p99
// is.
func BenchmarkLoginUnderCPUStorm(b *testing.B) {
	const logins = 20
	var without, with []time.Duration
	var withoutFailed, withFailed int
	for b.Loop() {
		ws := newWorkspace(b, stormLimits)
		lat, failed, spin := stormLogins(ws, 2*time.Second, logins)
		without, withoutFailed = append(without, lat...), withoutFailed+failed
		for _, s := range spin {
			s.cmd.Process.Kill()
			<-s.done
		}
		ws.startGuardian(b.TempDir()+"/state.json", nil)
		// Two storm looks: the first is the baseline.
		lat, failed, spin = stormLogins(ws, 2*time.Second+2*guard.Defaults().StormEvery, logins)
		with, withFailed = append(with, lat...), withFailed+failed
		alive := 0
		for _, s := range spin {
			if s.alive() {
				alive++
			}
		}
		if alive != stormSpinners {
			b.Errorf("%d spinners killed", stormSpinners-alive)
		}
	}
	b.ReportMetric(ms(percentile(without, 0.5)), "kernel-p50-ms")
	b.ReportMetric(ms(percentile(without, 0.99)), "kernel-p99-ms")
	b.ReportMetric(100*float64(len(without)-withoutFailed)/float64(len(without)), "kernel-login-ok-%")
	b.ReportMetric(ms(percentile(with, 0.5)), "guardian-p50-ms")
	b.ReportMetric(ms(percentile(with, 0.99)), "guardian-p99-ms")
	b.ReportMetric(100*float64(len(with)-withFailed)/float64(len(with)), "guardian-login-ok-%")
	b.ReportMetric(float64(percentile(without, 0.99))/float64(percentile(with, 0.99)), "p99-x")
}

// stormLogins starts stormSpinners spinners in ws, waits settle and logs
// in logins times, one after another; a failed login counts 20 s. It
// returns the latencies, the failures and the spinners.
func stormLogins(ws *workspace, settle time.Duration, logins int) (lat []time.Duration, failed int, spin []*proc) {
	for i := 0; i < stormSpinners; i++ {
		spin = append(spin, ws.user(bins.workload, "spin"))
	}
	time.Sleep(settle)
	for i := 0; i < logins; i++ {
		took, err := ws.login(20 * time.Second)
		if err != nil {
			failed++
			took = 20 * time.Second
		}
		lat = append(lat, took)
	}
	return lat, failed, spin
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkForkBomb: logins and containment during a fork bomb at the
// production pids.max, without guardian (the kernel's limit alone) and with
// it, in the same run. "shell" is the classic bomb, which the kernel may
// stop by itself (dash exits when a fork is refused); "persistent" keeps
// re-spawning (shellBomb). Contained: bomb start → no bomb process left
// (capped at bombCap without guardian); contain-x is how many times faster
// guardian contains it.
func BenchmarkForkBomb(b *testing.B) {
	for _, v := range []struct{ name, script string }{
		{"shell", classicShellBomb},
		{"persistent", shellBomb},
	} {
		b.Run(v.name, func(b *testing.B) {
			var without, with bombRun
			for b.Loop() {
				ws := newWorkspace(b, bombLimits)
				without.add(bombOnce(ws, v.script))
				ws.startGuardian(b.TempDir()+"/state.json", defaultForkScan)
				if !eventually(bombCap, func() bool { return countExe(ws, "/usr/bin/dash") == 0 }) {
					b.Fatal("guardian did not clear what the bomb left without it")
				}
				time.Sleep(time.Second)
				with.add(bombOnce(ws, v.script))
			}
			without.report(b, "kernel")
			with.report(b, "guardian")
			if with.contained > 0 {
				b.ReportMetric(without.contained.Seconds()/with.contained.Seconds(), "contain-x")
			}
		})
	}
}

// bombCap is how long a bomb may run without guardian before it counts as
// never contained.
const bombCap = 20 * time.Second

// bombRun adds up bomb scenarios.
type bombRun struct {
	ok, failed int
	contained  time.Duration // summed, averaged by report
	n          int
}

func (r *bombRun) add(o bombRun) {
	r.ok += o.ok
	r.failed += o.failed
	r.contained += o.contained
	r.n++
}

func (r *bombRun) report(b *testing.B, label string) {
	if r.ok+r.failed > 0 {
		b.ReportMetric(100*float64(r.ok)/float64(r.ok+r.failed), label+"-login-ok-%")
	}
	if r.n > 0 {
		r.contained /= time.Duration(r.n)
		r.n = 1
		b.ReportMetric(float64(r.contained.Milliseconds()), label+"-contained-ms")
	}
}

// bombOnce starts the bomb with logins every 200 ms and returns the
// logins from bomb start until a second after it was contained.
func bombOnce(ws *workspace, script string) bombRun { return bombCapped(ws, script, bombCap) }

// bombCapped is bombOnce with the bomb counted as never contained after
// limit (stretched by the time scale, as every wait).
func bombCapped(ws *workspace, script string, limit time.Duration) bombRun {
	ws.t.Helper()
	l := ws.loginLoop(200*time.Millisecond, 5*time.Second)
	start := time.Now()
	bomb := ws.user("/bin/sh", "-c", script)
	took := scaled(limit)
	if eventually(limit, func() bool { return !bomb.alive() && countExe(ws, "/usr/bin/dash") == 0 }) {
		took = time.Since(start)
	}
	time.Sleep(time.Second)
	lat, failures := l.finish()
	ws.t.Logf("bomb: contained after %v, logins %d ok, %d failed %v", took.Round(time.Millisecond), len(lat), len(failures), failures)
	return bombRun{ok: len(lat), failed: len(failures), contained: took}
}

// BenchmarkGuardianIdle: guardian's own CPU and memory while it watches a
// quiet workspace with the production periods (one op = one second).
func BenchmarkGuardianIdle(b *testing.B) {
	ws := newWorkspace(b, testcgroup.Limits{MemoryBytes: 1 << 30, Pids: 512, CPUs: 1})
	g := ws.startGuardian(b.TempDir()+"/state.json", productionPeriods())
	cpu0, _, _ := g.usage()
	for b.Loop() {
		time.Sleep(time.Second)
	}
	cpu1, rss, _ := g.usage()
	b.ReportMetric(float64((cpu1-cpu0).Milliseconds())/float64(b.N), "cpu-ms/s")
	b.ReportMetric(float64(rss)/(1<<20), "RSS-MiB")
}

// productionPeriods is startGuardian's extra that puts every period
// fastEnv shortens back to guardian's defaults.
func productionPeriods() map[string]string {
	defaults := map[string]string{}
	for k := range fastEnv() {
		defaults[k] = "" // back to guardian's defaults
	}
	return defaults
}
