// Package guardianvm runs guardian's end-to-end scenarios, and the
// real-kernel tests of its cgroup adapter, on a real cgroup v2 kernel: it
// builds guardian, its workload tool and the two test binaries, boots them
// with OpenSSH, a shell and a C toolchain (make, gcc, binutils: the build
// scenario's) in a VM whose kernel runs cgroup v2 only (localrun/guestvm).
// Every test the guest reports, subtests included, becomes a subtest
// here with the guest's verdict — a failure fails it, a skip skips it with
// the guest's reason — so `make test`'s skip check holds the guest to
// test/skips.md exactly as it holds the host: a skip not listed there
// fails the run. The same scenarios run on the host's cgroup v1 in
// guardian/e2e itself.
package guardianvm

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
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

// gccLib is where Debian's gcc 12 keeps its compiler proper, start files
// and own headers.
const gccLib = "/usr/lib/gcc/x86_64-linux-gnu/12"

// toolchain are the programs of the build scenario (make -j16 of a real C
// library): make and the commands its Makefile runs, the gcc driver under
// both names with its compiler proper, and binutils. All from Debian's
// packages on the host (make test installs build-essential).
var toolchain = []string{
	"/usr/bin/make", "/usr/bin/cc", "/usr/bin/gcc", gccLib + "/cc1", gccLib + "/collect2", gccLib + "/liblto_plugin.so",
	"/usr/bin/as", "/usr/bin/ld", "/usr/bin/ar", "/usr/bin/grep", "/usr/bin/uname", "/usr/bin/md5sum", "/usr/bin/ls",
	"/usr/bin/mkdir", "/usr/bin/cp", "/usr/bin/rm", "/usr/bin/sed", "/usr/bin/chmod", "/usr/bin/echo", "/usr/bin/true", "/usr/bin/test",
}

// toolchainTrees are the directories the compiler reads whole: the C
// library's architecture headers and the kernel's, and gcc's own headers
// and start files (less toolchainSkip). The C library's top-level headers
// are toolchainHeaders.
var toolchainTrees = []string{"/usr/include/x86_64-linux-gnu", "/usr/include/linux", "/usr/include/asm-generic", gccLib}

// toolchainHeaders are the top-level files of /usr/include (not its other
// projects' subdirectories: C++, node, LLVM).
const toolchainHeaders = "/usr/include/*"

// toolchainSkip are the parts of gcc's directory no C build reads (C++,
// LTO), left out of the guest's memory.
var toolchainSkip = regexp.MustCompile(`^` + regexp.QuoteMeta(gccLib) + `/(cc1plus|lto1|lto-wrapper|g\+\+-mapper-server|plugin/)`)

// startFiles are the C library's files gcc links with (its probes of the
// compiler link a program).
var startFiles = []string{
	"/usr/lib/x86_64-linux-gnu/crt1.o", "/usr/lib/x86_64-linux-gnu/crti.o", "/usr/lib/x86_64-linux-gnu/crtn.o",
	"/usr/lib/x86_64-linux-gnu/libc.so", "/usr/lib/x86_64-linux-gnu/libc_nonshared.a", "/usr/lib/x86_64-linux-gnu/libm.so",
}

// zstdModule is the module guardian/e2e's build scenario builds (its
// zstdModule); its C sources go into the guest's source cache, where that
// scenario looks first, since the guest has neither network nor go.
const zstdModule = "github.com/valyala/gozstd@v1.21.1"

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
	code := runInGuest(t, console, `rc=0; for t in cgroupfs e2e; do echo "`+binaryMarker+`$t"; "$0/$t.test" -test.v -test.count=1 -test.timeout=25m -test.run "$1" || rc=1; done; exit $rc`, run)
	if len(console.verdicts) == 0 {
		t.Fatal("the guest ran no test")
	}
	counts := map[string]int{}
	for _, v := range console.verdicts {
		counts[v.result]++
		t.Run(v.name, func(t *testing.T) {
			switch v.result {
			case "FAIL":
				t.Errorf("failed on cgroup v2 (its output is above)")
			case "SKIP":
				t.Skipf("skipped on cgroup v2: %s", v.reason)
			}
		})
	}
	t.Logf("on cgroup v2: exit %d; of %d tests and subtests, %d passed, %d failed, %d skipped", code, len(console.verdicts), counts["PASS"], counts["FAIL"], counts["SKIP"])
	if code != 0 && counts["FAIL"] == 0 {
		t.Errorf("the test binaries exited %d in the guest without a failed test", code)
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
	for _, p := range append(append([]string(nil), guestPrograms...), toolchain...) {
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
	for _, f := range append(guestFiles, startFiles...) {
		files[f] = f
	}
	if err := addToolchainTrees(files); err != nil {
		tb.Fatal(err)
	}
	src, err := zstdLib(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if err := addTree(files, src, "/root/.cache/labkeep/build-src/zstd-lib", nil); err != nil {
		tb.Fatal(err)
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
		Kernel: kernel, Init: init, Programs: append(append([]string(nil), guestPrograms...), toolchain...), Files: files,
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

// resultLine is go test -v's verdict for a test or subtest (indented by
// its depth).
var resultLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (Test\S+) \(`)

// runLine starts a test's output.
var runLine = regexp.MustCompile(`^=== (?:RUN|CONT)\s+(Test\S+)`)

// logLine is a message a test logged (t.Log, t.Skip): file, line, text.
var logLine = regexp.MustCompile(`^\s+\w+_test\.go:\d+: (.*)`)

// binaryMarker is what the guest's script prints before running each test
// binary, followed by its name.
const binaryMarker = "=== labkeep test binary: "

// verdict is one test's result in the guest, named by its test binary
// and its full name; reason is its last logged message (a skip's reason).
type verdict struct {
	name, result, reason string
}

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
	tb       testing.TB
	start    time.Time
	partial  string
	binary   string
	running  string            // the test whose output comes now
	last     map[string]string // each test's last logged message
	verdicts []verdict
	benches  []benchResult
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.partial += string(p)
	for {
		i := strings.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(l.partial[:i], "\r")
		l.partial = l.partial[i+1:]
		l.tb.Logf("[guest %6.1fs] %s", time.Since(l.start).Seconds(), line)
		l.read(line)
	}
	return len(p), nil
}

// read takes one line of the guest's console.
func (l *lineLog) read(line string) {
	if l.last == nil {
		l.last = map[string]string{}
	}
	// The marker may follow the console's own escape sequences.
	if i := strings.Index(line, binaryMarker); i >= 0 {
		l.binary = line[i+len(binaryMarker):]
		return
	}
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
	if m := runLine.FindStringSubmatch(line); m != nil {
		l.running = m[1]
		return
	}
	if m := logLine.FindStringSubmatch(line); m != nil && l.running != "" {
		l.last[l.running] = m[1]
		return
	}
	if m := resultLine.FindStringSubmatch(line); m != nil {
		l.verdicts = append(l.verdicts, verdict{name: l.binary + "/" + m[2], result: m[1], reason: l.last[m[2]]})
	}
}

// addToolchainTrees adds toolchainTrees (less toolchainSkip) and
// toolchainHeaders to files (guest path → host path), at the same paths.
func addToolchainTrees(files map[string]string) error {
	for _, root := range toolchainTrees {
		if err := addTree(files, root, root, func(p string) bool { return !toolchainSkip.MatchString(p) }); err != nil {
			return err
		}
	}
	top, err := filepath.Glob(toolchainHeaders)
	if err != nil {
		return err
	}
	for _, p := range top {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			files[p] = p
		}
	}
	return nil
}

// addTree adds every regular file under host directory dir (symbolic
// links followed) to files at the same place under guest, those keep
// accepts (by host path; nil keeps all).
func addTree(files map[string]string, dir, guest string, keep func(string) bool) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || (keep != nil && !keep(p)) {
			return err
		}
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
			return nil // a directory, or a dangling link
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		files[filepath.Join(guest, rel)] = p
		return nil
	})
}

// zstdLib is the host directory of zstdModule's C library, from the Go
// module cache (downloaded through the module proxy if missing).
func zstdLib(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "mod", "download", "-json", zstdModule).Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", zstdModule, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s printed no module directory: %v", zstdModule, err)
	}
	return filepath.Join(mod.Dir, "zstd", "lib"), nil
}
