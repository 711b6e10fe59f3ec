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
	if os.Geteuid() != 0 {
		t.Skip("needs root like guardian/e2e itself")
	}
	kernel := guestvm.RequireKernel(t)
	for _, p := range guestPrograms {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("needs %s on the host (make test installs it): %v", p, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 28*time.Minute)
	defer cancel()
	dir := t.TempDir()
	init, err := guestvm.BuildInit(ctx, dir)
	if err != nil {
		t.Fatal(err)
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
			t.Fatalf("go %v: %v\n%s", args, err, b)
		}
		files[guestBin+"/"+name] = filepath.Join(dir, name)
	}
	run := os.Getenv("LABKEEP_V2_RUN") // a -test.run filter, to run one scenario by hand
	if run == "" {
		run = "."
	}
	console := &lineLog{t: t, start: time.Now()}
	code, err := guestvm.Run(ctx, guestvm.Spec{
		Kernel: kernel, Init: init, Programs: guestPrograms, Files: files,
		// cgroupfs's real-kernel tests first (the v2 adapter itself), then
		// the scenarios.
		Command: []string{"/bin/sh", "-c", `rc=0; for t in cgroupfs e2e; do "$0/$t.test" -test.v -test.count=1 -test.timeout=25m -test.run "$1" || rc=1; done; exit $rc`, guestBin, run},
		// Under TCG the guest runs several times slower than the host (an
		// idle login: about 0.7 s against 0.1 s): the scenarios get
		// proportionally more time, nothing else changes.
		Env:       []string{"GUARDIAN_E2E_BIN_DIR=" + guestBin, "GUARDIAN_E2E_TIME_SCALE=" + guestTimeScale},
		MemoryMiB: 4096, CPUs: 2,
		Output: console,
	})
	if err != nil {
		t.Fatal(err)
	}
	results := console.results()
	t.Logf("on cgroup v2 (kernel %s): exit %d, %d scenarios: %v", filepath.Base(kernel), code, len(results), results)
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

// resultLine is go test -v's verdict for a top-level test.
var resultLine = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): (Test\w+)`)

// lineLog logs the guest's console line by line as it arrives (so a hung
// scenario shows where it hangs) and collects the verdicts.
type lineLog struct {
	t       *testing.T
	start   time.Time
	partial string
	verdict map[string]string
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
		l.t.Logf("[guest %6.1fs] %s", time.Since(l.start).Seconds(), line)
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
