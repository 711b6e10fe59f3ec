package e2e

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"labkeep/guardian/internal/testcgroup"
)

// sandbox is a Pod's sandbox: PID 1 of a new PID namespace with its own
// /proc, in the sandbox container's cgroup. The Pod's other containers
// join its PID and mount namespaces, as shareProcessNamespace makes them.
type sandbox struct {
	pid1 int // host PID of the namespace's PID 1
}

func newSandbox(t *testing.T, pod *testcgroup.Pod) sandbox {
	t.Helper()
	rel := pod.Container(t, testcgroup.Limits{MemoryBytes: 64 << 20, Pids: 16})
	p := start(t, testcgroup.Command(rel, "/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "--propagation", "private", "/bin/sleep", "infinity"))
	var pid1 int
	if !eventually(10*time.Second, func() bool {
		for _, pid := range testcgroup.Procs(rel) {
			if exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); pid != p.cmd.Process.Pid && exe == "/usr/bin/sleep" {
				pid1 = pid
				return true
			}
		}
		return false
	}) {
		t.Fatal("the sandbox's PID 1 never started")
	}
	return sandbox{pid1: pid1}
}

// command runs args in a container of the Pod: in cgroup rel, in the
// sandbox's PID and mount namespaces.
func (s sandbox) command(rel string, args ...string) *exec.Cmd {
	return testcgroup.Command(rel, "/usr/bin/nsenter", append([]string{"-t", strconv.Itoa(s.pid1), "-p", "-m", "--"}, args...)...)
}

// podGuardian runs guardian as the Pod's native sidecar would run: in its
// own container cgroup, in the Pod's shared PID namespace, under a private
// cgroup namespace (its /proc/self/cgroup reads "/"), finding the
// workspace from POD_UID and CONTAINER_NAME.
func podGuardian(t *testing.T, pod *testcgroup.Pod, sb sandbox, ws *workspace, m uint64) (*guardian, func() string) {
	t.Helper()
	env := fastEnv()
	env["POD_UID"] = pod.UID
	env["CONTAINER_NAME"] = "workspace"
	env["GUARDIAN_MEMORY_LIMIT"] = strconv.FormatUint(m, 10)
	env["GUARDIAN_PIDS_MAX"] = strconv.Itoa(ws.lim.Pids)
	env["GUARDIAN_SSH_ADDR"] = ws.sshAddr
	env["GUARDIAN_LISTEN"] = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	env["GUARDIAN_STATE_PATH"] = filepath.Join(t.TempDir(), "state.json")
	env["GUARDIAN_CLEANUP_TOKEN"] = cleanupToken
	var rel string
	g := &guardian{t: t, api: "http://" + env["GUARDIAN_LISTEN"], state: env["GUARDIAN_STATE_PATH"], env: envList(env), started: "/livez",
		wrap: func(args []string) *exec.Cmd {
			// A restarted sidecar is a new container: a new cgroup.
			rel = pod.Container(t, testcgroup.Limits{MemoryBytes: 128 << 20, Pids: 64})
			return sb.command(rel, append([]string{"/usr/bin/unshare", "--cgroup", "--"}, args...)...)
		}}
	g.start()
	return g, func() string { return rel }
}

// startPodWorkspace starts the workspace container: a new cgroup, sshd
// as its main process, LABKEEP_CONTAINER_NAME=workspace in its
// environment as the Pod spec sets it.
func startPodWorkspace(t *testing.T, pod *testcgroup.Pod, sb sandbox, ws *workspace) {
	t.Helper()
	ws.rel = pod.Container(t, ws.lim)
	ws.sshd = start(t, sb.command(ws.rel, append([]string{"/usr/bin/env", "LABKEEP_CONTAINER_NAME=workspace"}, ws.sshdArgs()...)...))
	ws.waitSSH()
}

// guardianPID is the host PID of the guardian binary in cgroup rel.
func guardianPID(t *testing.T, rel string) int {
	t.Helper()
	for _, pid := range testcgroup.Procs(rel) {
		if exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); exe == bins.guardian {
			return pid
		}
	}
	t.Fatalf("no guardian process in %s", rel)
	return 0
}

// guardian in a Pod laid out as kubelet and containerd lay it out (cgroup
// v1, cgroupfs driver): it starts before the workspace container exists
// and under a private cgroup namespace, tells its own cgroup and the
// sandbox's from the workspace's, guards the workspace once it runs,
// follows it to its new cgroup when the container restarts, and a
// guardian killed between freeze and thaw leaves no frozen workspace once
// the kubelet restarts it.
func TestGuardianInAPod(t *testing.T) {
	requireEnv(t)
	var m uint64 = 512 << 20
	pod := testcgroup.NewPod(t, "burstable", testcgroup.Limits{MemoryBytes: 2 << 30, Pids: 4096})
	sb := newSandbox(t, pod)
	ws := newSSHConfig(t, testcgroup.Limits{MemoryBytes: m, Pids: 512, CPUs: 1})
	wantLimit := strconv.FormatUint(uint64(0.98*float64(m))/4096*4096, 10)
	handedOver := func(rel string) bool { ok, _ := oomHandedOver(t, rel); return ok }
	guarded := func(rel string) bool {
		return readKnob(t, rel, "memory", "memory.limit_in_bytes") == wantLimit &&
			readKnob(t, rel, "pids", "pids.max") == strconv.Itoa(ws.lim.Pids) &&
			handedOver(rel)
	}

	// guardian starts first: started (live), not ready, touching nothing.
	g, guardianRel := podGuardian(t, pod, sb, ws, m)
	gpid := guardianPID(t, guardianRel())
	if own, _ := os.Readlink("/proc/self/ns/cgroup"); readLink(t, "/proc/"+strconv.Itoa(gpid)+"/ns/cgroup") == own {
		t.Fatal("guardian shares the test's cgroup namespace; it must run under a private one")
	}
	out, err := exec.Command("/usr/bin/nsenter", "-t", strconv.Itoa(gpid), "-C", "--", "/bin/cat", "/proc/"+strconv.Itoa(gpid)+"/cgroup").CombinedOutput()
	rootLine := ":memory:/\n"
	if onV2() {
		rootLine = "0::/\n"
	}
	if err != nil || !strings.Contains(string(out), rootLine) {
		t.Fatalf("guardian's own view of its cgroup = %q (%v); want the namespace root /", out, err)
	}
	if code := g.status("/healthz"); code != 503 {
		t.Errorf("/healthz before the workspace exists = %d; want 503", code)
	}
	ownLimit := readKnob(t, guardianRel(), "memory", "memory.limit_in_bytes")

	// The workspace container starts: guardian guards it.
	began := time.Now()
	startPodWorkspace(t, pod, sb, ws)
	up := time.Now()
	if !eventually(20*time.Second, func() bool { return g.status("/healthz") == 200 && guarded(ws.rel) }) {
		t.Fatalf("guardian never guarded the workspace %s: /healthz %d, limit %s", ws.rel, g.status("/healthz"), readKnob(t, ws.rel, "memory", "memory.limit_in_bytes"))
	}
	t.Logf("workspace container started → guarded (limits applied, /healthz 200): %v (sshd answered after %v)",
		time.Since(began).Round(time.Millisecond), up.Sub(began).Round(time.Millisecond))
	// guardian's own container comes first on the Pod's CPU; the
	// workspace's and the Pod's weights are not guardian's to change.
	wantCPU, cpuOf := "cpu.shares 262144", func(rel string) string { return "cpu.shares " + readKnob(t, rel, "cpu", "cpu.shares") }
	if onV2() {
		wantCPU, cpuOf = "cpu.weight 10000", func(rel string) string { return "cpu.weight " + readKnob(t, rel, "cpu", "cpu.weight") }
	}
	if !eventually(5*time.Second, func() bool { return cpuOf(guardianRel()) == wantCPU }) {
		t.Errorf("guardian's own CPU weight: %s; want %s", cpuOf(guardianRel()), wantCPU)
	}
	for _, rel := range []string{ws.rel, pod.Rel} {
		if got := cpuOf(rel); got == wantCPU {
			t.Errorf("guardian set the CPU weight of %s, which is not its own: %s", rel, got)
		}
	}
	for _, rel := range []string{guardianRel(), pod.Rel} {
		if got := readKnob(t, rel, "memory", "memory.limit_in_bytes"); rel == guardianRel() && got != ownLimit {
			t.Errorf("guardian changed its own cgroup's memory limit: %s → %s", ownLimit, got)
		}
		if handedOver(rel) {
			t.Errorf("guardian took over OOM handling of %s, which is not the workspace", rel)
		}
	}
	if _, err := ws.login(5 * time.Second); err != nil {
		t.Errorf("login to the guarded workspace: %v", err)
	}
	// From inside the Pod's PID namespace guardian sees, chooses and kills
	// the workspace's processes: a hog beyond M dies, the kernel's OOM
	// killer never fires, logins keep working.
	hog := start(t, sb.command(ws.rel, "/usr/bin/setpriv", "--bounding-set", userDrop, "--", bins.workload, "hog", "-mb", "700", "-step", "8", "-every", "5ms"))
	select {
	case <-hog.done:
	case <-time.After(scaled(30 * time.Second)):
		t.Fatalf("guardian did not kill a hog beyond the limit: %v", g.alerts())
	}
	if !eventually(10*time.Second, func() bool { _, ok := g.hasAlert("memory-kill"); return ok }) {
		t.Errorf("the hog ended without a memory-kill alert: %v", g.alerts())
	}
	if n := keyed(t, ws.rel, "memory", "memory.oom_control")["oom_kill"]; n != 0 {
		t.Errorf("the kernel OOM killer killed %d process(es)", n)
	}
	if _, err := ws.login(5 * time.Second); err != nil {
		t.Errorf("login after the hog: %v", err)
	}

	// The workspace container restarts: the runtime kills what is left
	// and removes its cgroup, the kubelet starts it again in a new one.
	gone := time.Now()
	testcgroup.Remove(t, ws.rel)
	if !eventually(20*time.Second, func() bool { return g.status("/healthz") == 503 }) {
		t.Fatalf("/healthz stayed %d after the workspace's cgroup went away", g.status("/healthz"))
	}
	t.Logf("workspace cgroup removed → /healthz 503: %v", time.Since(gone).Round(time.Millisecond))
	began = time.Now()
	startPodWorkspace(t, pod, sb, ws)
	up = time.Now()
	if !eventually(20*time.Second, func() bool { return g.status("/healthz") == 200 && guarded(ws.rel) }) {
		t.Fatalf("guardian never guarded the restarted workspace %s", ws.rel)
	}
	t.Logf("restarted workspace container started → guarded in its new cgroup: %v (sshd answered after %v; GUARDIAN_WATCH_EVERY 1s)",
		time.Since(began).Round(time.Millisecond), up.Sub(began).Round(time.Millisecond))
	if _, ok := g.hasAlert("workspace-gone"); !ok {
		t.Errorf("no workspace-gone alert: %v", g.alerts())
	}

	// guardian is killed between freeze and thaw; the kubelet restarts
	// the sidecar (a new container, so a new cgroup).
	setFrozen(t, ws.rel, true)
	g.kill()
	testcgroup.Remove(t, guardianRel())
	g.start()
	if !eventually(20*time.Second, func() bool { return g.status("/healthz") == 200 }) {
		t.Fatalf("the restarted guardian never guarded the workspace")
	}
	if frozen(t, ws.rel) {
		t.Error("the workspace is still frozen after guardian's restart")
	}
	if !guarded(ws.rel) {
		t.Errorf("limits after guardian's restart: %s, pids %s", readKnob(t, ws.rel, "memory", "memory.limit_in_bytes"), readKnob(t, ws.rel, "pids", "pids.max"))
	}
	if _, err := ws.login(5 * time.Second); err != nil {
		t.Errorf("login after guardian's restart: %v", err)
	}
}

func readLink(t *testing.T, path string) string {
	t.Helper()
	s, err := os.Readlink(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
