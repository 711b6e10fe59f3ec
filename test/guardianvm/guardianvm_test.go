// Package guardianvm runs guardian's end-to-end scenarios, and the
// real-kernel tests of its cgroup adapter, on a real cgroup v2 kernel: it
// builds guardian, its workload tool and the two test binaries, boots them
// with OpenSSH and a shell in a VM whose kernel runs cgroup v2 only
// (localrun/guestvm), and fails for every test that does not pass there. The same scenarios run on the host's cgroup v1 in
// guardian/e2e itself.
package guardianvm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"labkeep/localrun/guestvm"
)

// guestPrograms are the host programs the scenarios run in the guest: the
// workspace's sshd and shells, and the tools the harness wraps them in.
var guestPrograms = []string{
	"/usr/sbin/sshd", "/usr/bin/ssh-keygen", "/usr/bin/setpriv", "/usr/bin/unshare", "/usr/bin/nsenter",
	"/usr/bin/mount", "/usr/bin/env", "/usr/bin/sleep", "/usr/bin/cat", "/usr/bin/kill", "/usr/bin/nice", "/usr/bin/cut", "/usr/bin/dash", "/usr/bin/bash", "/usr/bin/sh",
}

// guestFiles are host files the programs read (users for sshd's privilege
// separation and root's shell, name service configuration).
var guestFiles = []string{"/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/ld.so.cache"}

// guestTimeScale is the scenarios' time scale in the guest.
const guestTimeScale = "8"

// The harness reads prebuilt binaries from here in the guest.
const guestBin = "/opt/e2e/bin"

func TestScenariosOnCgroupV2(t *testing.T) {
	run := os.Getenv("LABKEEP_V2_RUN") // a -test.run filter, to run one scenario by hand
	if run == "" {
		run = "."
	}
	// cgroupfs's real-kernel tests first (the v2 adapter itself), then the
	// scenarios.
	console := &lineLog{tb: t, start: time.Now()}
	code := runInGuest(t, console, `rc=0; for t in cgroupfs e2e; do "$0/$t.test" -test.v -test.count=1 -test.timeout=25m -test.run "$1" || rc=1; done; exit $rc`, run)
	results := console.results()
	t.Logf("on cgroup v2: exit %d, %d scenarios: %v", code, len(results), results)
	if len(results) == 0 {
		t.Fatal("the guest ran no scenario")
	}
	for name, r := range results {
		if r == "FAIL" {
			t.Errorf("%s failed on cgroup v2 (its output is above)", name)
		}
	}
	if code != 0 && !t.Failed() {
		t.Errorf("the scenarios' test binary exited %d in the guest", code)
	}
}

// BenchmarkScenariosOnCgroupV2 runs guardian's end-to-end benchmarks
// (LABKEEP_V2_BENCH, a -test.bench filter, all by default) once each in the
// guest and reports each guest figure as a sub-benchmark here. The guest's
// CPU is emulated (TCG, several times slower than the host, more for
// process creation): its latencies are no production figures; the ratios
// between with and without guardian measured in the same guest are.
func BenchmarkScenariosOnCgroupV2(b *testing.B) {
	filter := os.Getenv("LABKEEP_V2_BENCH")
	if filter == "" {
		filter = "."
	}
	for b.Loop() {
		console := &lineLog{tb: b, start: time.Now()}
		if code := runInGuest(b, console, `"$0/e2e.test" -test.run '^$' -test.bench "$1" -test.benchtime 1x -test.timeout=25m`, filter); code != 0 {
			b.Fatalf("the benchmarks exited %d in the guest (output above)", code)
		}
		if len(console.benches) == 0 {
			b.Fatal("the guest ran no benchmark")
		}
		for _, r := range console.benches {
			b.Run(r.name, func(b *testing.B) {
				for range b.N {
				}
				for unit, v := range r.metrics {
					b.ReportMetric(v, unit)
				}
			})
		}
	}
}

// runInGuest builds guardian, its workload tool and the two test binaries,
// boots them in the cgroup v2 guest and runs script there with /bin/sh
// ($0 is the binaries' directory, $1 arg); it returns the script's exit
// code and fails tb when the guest cannot run it.
func runInGuest(tb testing.TB, console *lineLog, script, arg string) int {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root like guardian/e2e itself")
	}
	kernel := guestvm.RequireKernel(tb)
	for _, p := range guestPrograms {
		if _, err := os.Stat(p); err != nil {
			tb.Skipf("needs %s on the host (make test installs it): %v", p, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 28*time.Minute)
	defer cancel()
	dir := tb.TempDir()
	init, err := guestvm.BuildInit(ctx, dir)
	if err != nil {
		tb.Fatal(err)
	}
	files := map[string]string{}
	for _, f := range guestFiles {
		files[f] = f
	}
	for name, args := range map[string][]string{
		"guardian":      {"build", "-o", filepath.Join(dir, "guardian"), "labkeep/guardian/cmd/guardian"},
		"workload":      {"build", "-o", filepath.Join(dir, "workload"), "labkeep/guardian/internal/workload"},
		"e2e.test":      {"test", "-c", "-o", filepath.Join(dir, "e2e.test"), "labkeep/guardian/e2e"},
		"cgroupfs.test": {"test", "-c", "-o", filepath.Join(dir, "cgroupfs.test"), "labkeep/guardian/cgroupfs"},
	} {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("go %v: %v\n%s", args, err, b)
		}
		files[guestBin+"/"+name] = filepath.Join(dir, name)
	}
	code, err := guestvm.Run(ctx, guestvm.Spec{
		Kernel: kernel, Init: init, Programs: guestPrograms, Files: files,
		Command: []string{"/bin/sh", "-c", script, guestBin, arg},
		// Under TCG the guest runs several times slower than the host (an
		// idle login: about 0.7 s against 0.1 s): the scenarios get
		// proportionally more time, nothing else changes.
		Env:       []string{"GUARDIAN_E2E_BIN_DIR=" + guestBin, "GUARDIAN_E2E_TIME_SCALE=" + guestTimeScale},
		MemoryMiB: 4096, CPUs: 2,
		Output: console,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("guest kernel %s", filepath.Base(kernel))
	return code
}

// resultLine is go test -v's verdict for a top-level test.
var resultLine = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): (Test\w+)`)

// benchLine is a benchmark's result line: name, iterations, then value
// and unit pairs.
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

// benchResult is one benchmark's figures in the guest.
type benchResult struct {
	name    string
	metrics map[string]float64
}

// lineLog logs the guest's console line by line as it arrives (so a hung
// scenario shows where it hangs) and collects the verdicts and benchmark
// results.
type lineLog struct {
	tb      testing.TB
	start   time.Time
	partial string
	verdict map[string]string
	benches []benchResult
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.partial += string(p)
	for {
		i := strings.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := l.partial[:i]
		l.partial = l.partial[i+1:]
		l.tb.Logf("[guest %6.1fs] %s", time.Since(l.start).Seconds(), line)
		if m := benchLine.FindStringSubmatch(line); m != nil {
			r := benchResult{name: strings.TrimPrefix(m[1], "Benchmark"), metrics: map[string]float64{}}
			f := strings.Fields(m[2])
			for i := 0; i+1 < len(f); i += 2 {
				if v, err := strconv.ParseFloat(f[i], 64); err == nil {
					r.metrics[f[i+1]] = v
				}
			}
			l.benches = append(l.benches, r)
		}
		if m := resultLine.FindStringSubmatch(line); m != nil {
			if l.verdict == nil {
				l.verdict = map[string]string{}
			}
			l.verdict[m[2]] = m[1]
		}
	}
	return len(p), nil
}

func (l *lineLog) results() map[string]string { return l.verdict }
