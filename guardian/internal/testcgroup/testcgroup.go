// Package testcgroup creates real, throwaway cgroups for guardian's tests
// and removes them, with every process inside, when the test ends — even
// when it fails. Limits are always written before any process is placed in
// the cgroup, so a test's memory hog or fork bomb can never reach the host.
package testcgroup

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// V1Root is where this machine mounts its cgroup v1 controllers.
const V1Root = "/sys/fs/cgroup"

// V2Root is the cgroup2 mount: beside the v1 controllers (hybrid layout)
// or, on a v2-only machine, V1Root itself.
var V2Root = func() string {
	if Unified() {
		return V1Root
	}
	return "/sys/fs/cgroup/unified"
}()

// Controllers are the v1 controllers a workspace cgroup gets.
var Controllers = []string{"memory", "pids", "freezer", "cpu", "cpuacct"}

// Limits are written before anything runs in the cgroup.
type Limits struct {
	MemoryBytes uint64  // memory.limit_in_bytes, required
	Pids        int     // pids.max, required
	CPUs        float64 // CFS quota in CPUs; 0 means no quota
}

// Unified reports whether this machine runs cgroup v2 only: the cgroup2
// hierarchy is mounted at V1Root itself (a production node, or the test
// VM), not beside v1 controllers.
func Unified() bool { return unified }

// unified is read once: the machine's hierarchy does not change under a
// test binary, and Dir and Command ask for every path they build.
var unified = func() bool {
	_, err := os.Stat(filepath.Join(V1Root, "cgroup.controllers"))
	return err == nil
}()

// unifiedControllers are what a workspace cgroup needs on a v2-only
// machine: its parent must delegate them.
var unifiedControllers = []string{"memory", "pids", "cpu"}

// RequireRoot skips the test unless it runs as root with cgroup v1
// controllers mounted at V1Root, or on a v2-only machine whose root cgroup
// delegates the memory, pids and cpu controllers.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates real cgroups (CI runs as root)")
	}
	if Unified() {
		b, _ := os.ReadFile(filepath.Join(V1Root, "cgroup.subtree_control"))
		for _, c := range unifiedControllers {
			if !strings.Contains(" "+string(b)+" ", " "+c+" ") {
				t.Skipf("the root cgroup does not delegate the %s controller (cgroup.subtree_control: %q)", c, b)
			}
		}
		return
	}
	for _, c := range Controllers {
		if _, err := os.Stat(filepath.Join(V1Root, c, "cgroup.procs")); err != nil {
			t.Skipf("needs the cgroup v1 %s controller at %s: %v", c, V1Root, err)
		}
	}
}

// New creates a workspace cgroup with lim applied, on whichever hierarchy
// the machine runs (see Unified), and returns its path relative to the
// mount ("/name"). It is removed, with every process in it, at cleanup.
func New(t testing.TB, lim Limits) string {
	t.Helper()
	if !Unified() {
		return NewV1(t, lim)
	}
	RequireRoot(t)
	rel := fmt.Sprintf("/labkeep-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	mkdir(t, rel)
	t.Cleanup(func() { Remove(t, rel) })
	setLimits(t, rel, lim)
	return rel
}

// mkdir creates the cgroup rel under every v1 controller, or on a v2-only
// machine its directory, delegating the workspace controllers to its
// parent's children first (the parent must have no processes, which holds
// for every directory this package makes above a container).
func mkdir(t testing.TB, rel string) {
	t.Helper()
	if !Unified() {
		for _, c := range Controllers {
			if err := os.Mkdir(filepath.Join(V1Root, c, rel), 0o755); err != nil {
				t.Fatalf("create cgroup: %v", err)
			}
		}
		return
	}
	if parent := filepath.Dir(Dir(rel, "")); parent != V1Root {
		mustWrite(t, parent, "cgroup.subtree_control", "+"+strings.Join(unifiedControllers, " +"))
	}
	if err := os.Mkdir(Dir(rel, ""), 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
}

// setLimits writes lim into cgroup rel: memory (swap off where the kernel
// accounts it), pids and, for CPUs > 0, a CFS quota over 100 ms periods.
func setLimits(t testing.TB, rel string, lim Limits) {
	t.Helper()
	if lim.MemoryBytes == 0 || lim.Pids == 0 {
		t.Fatal("testcgroup: a memory and a pids limit are required")
	}
	mem := strconv.FormatUint(lim.MemoryBytes, 10)
	if Unified() {
		dir := Dir(rel, "")
		mustWrite(t, dir, "memory.max", mem)
		_ = os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0)
		mustWrite(t, dir, "pids.max", strconv.Itoa(lim.Pids))
		if lim.CPUs > 0 {
			mustWrite(t, dir, "cpu.max", fmt.Sprintf("%d 100000", int(lim.CPUs*100000)))
		}
		return
	}
	mustWrite(t, Dir(rel, "memory"), "memory.limit_in_bytes", mem)
	_ = os.WriteFile(filepath.Join(Dir(rel, "memory"), "memory.memsw.limit_in_bytes"), []byte(mem), 0)
	mustWrite(t, Dir(rel, "pids"), "pids.max", strconv.Itoa(lim.Pids))
	if lim.CPUs > 0 {
		mustWrite(t, Dir(rel, "cpu"), "cpu.cfs_period_us", "100000")
		mustWrite(t, Dir(rel, "cpu"), "cpu.cfs_quota_us", strconv.Itoa(int(lim.CPUs*100000)))
	}
}

// NewV1 creates a cgroup named like the test under every v1 controller with
// lim applied and returns its path relative to each mount ("/name").
func NewV1(t testing.TB, lim Limits) string {
	t.Helper()
	RequireRoot(t)
	if Unified() {
		t.Skip("needs cgroup v1 controllers; the machine runs cgroup v2 only")
	}
	rel := fmt.Sprintf("/labkeep-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	mkdir(t, rel)
	t.Cleanup(func() { RemoveV1(t, rel) })
	setLimits(t, rel, lim)
	return rel
}

// Dir returns the directory of rel under one v1 controller, or on a
// v2-only machine its one directory (controller is then ignored).
func Dir(rel, controller string) string {
	if Unified() {
		return filepath.Join(V1Root, rel)
	}
	return filepath.Join(V1Root, controller, rel)
}

func mustWrite(t testing.TB, dir, name, v string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0); err != nil {
		t.Fatalf("write %s=%s: %v", name, v, err)
	}
}

// Procs lists the PIDs in the cgroup (memory controller).
func Procs(rel string) []int {
	b, _ := os.ReadFile(filepath.Join(Dir(rel, "memory"), "cgroup.procs"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// Remove kills everything in the workspace cgroup rel and removes it, on
// either hierarchy.
func Remove(t testing.TB, rel string) {
	if !Unified() {
		RemoveV1(t, rel)
		return
	}
	removeV2(t, Dir(rel, ""))
}

// removeV2 thaws the cgroup2 directory, kills everything in it with
// cgroup.kill and removes it, for up to 30 s.
func removeV2(t testing.TB, dir string) {
	_ = os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte("0"), 0)
	for i := 0; i < 1500; i++ {
		_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("remove cgroup2 %s: still busy after 30 s", dir)
}

// RemoveV1 kills everything in the cgroup (freeze, SIGKILL, thaw, until
// empty) and removes it from every controller.
func RemoveV1(t testing.TB, rel string) {
	fz := Dir(rel, "freezer")
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		pids := Procs(rel)
		if len(pids) == 0 {
			break
		}
		_ = os.WriteFile(filepath.Join(fz, "freezer.state"), []byte("FROZEN"), 0)
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		_ = os.WriteFile(filepath.Join(fz, "freezer.state"), []byte("THAWED"), 0)
		// Tasks waiting at the memory limit with the OOM killer off leave
		// once the limit is lifted.
		_ = os.WriteFile(filepath.Join(Dir(rel, "memory"), "memory.oom_control"), []byte("0"), 0)
		time.Sleep(20 * time.Millisecond)
	}
	for _, c := range Controllers {
		d := Dir(rel, c)
		var err error
		for i := 0; i < 100; i++ {
			if err = os.Remove(d); err == nil || os.IsNotExist(err) {
				err = nil
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("remove cgroup %s: %v", d, err)
		}
	}
}

// NewV2 creates a child of the cgroup2 mount for the test and removes it
// (killing its processes with cgroup.kill) at cleanup. It skips when the
// mount is absent.
func NewV2(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates real cgroups (CI runs as root)")
	}
	if _, err := os.Stat(filepath.Join(V2Root, "cgroup.freeze")); err != nil {
		if _, err := os.Stat(filepath.Join(V2Root, "cgroup.procs")); err != nil {
			t.Skipf("no cgroup2 mount at %s", V2Root)
		}
	}
	dir := filepath.Join(V2Root, fmt.Sprintf("labkeep-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create cgroup2: %v", err)
	}
	t.Cleanup(func() { removeV2(t, dir) })
	return dir
}

// Command returns a command that enters the workspace cgroup rel (every
// v1 controller, or the one v2 directory) and then execs name with args:
// the process is limited from its first instruction.
func Command(rel, name string, args ...string) *exec.Cmd {
	if Unified() {
		return CommandV2(Dir(rel, ""), name, args...)
	}
	var script strings.Builder
	for _, c := range Controllers {
		fmt.Fprintf(&script, "echo $$ > %s/cgroup.procs || exit 97; ", Dir(rel, c))
	}
	script.WriteString(`exec "$@"`)
	return exec.Command("/bin/sh", append([]string{"-c", script.String(), "sh", name}, args...)...)
}

// CommandV2 is Command for a cgroup2 directory.
func CommandV2(dir, name string, args ...string) *exec.Cmd {
	script := fmt.Sprintf(`echo $$ > %s/cgroup.procs || exit 97; exec "$@"`, dir)
	return exec.Command("/bin/sh", append([]string{"-c", script, "sh", name}, args...)...)
}

// Pod is a Pod's cgroup laid out as the kubelet and containerd lay it out
// with the cgroupfs driver — kubepods/<qos>/pod<uid>/<container id>, under
// every v1 controller or in the one v2 hierarchy — below a throwaway root
// of its own, so that it never meets a real kubelet's kubepods tree.
type Pod struct {
	UID string
	Rel string // the Pod's directory relative to each mount
}

// NewPod creates the Pod's directory (qos "burstable" or "besteffort"; ""
// for Guaranteed, which has none) with the Pod-level limits lim, and
// removes the whole tree at cleanup.
func NewPod(t testing.TB, qos string, lim Limits) *Pod {
	t.Helper()
	RequireRoot(t)
	if lim.MemoryBytes == 0 || lim.Pids == 0 {
		t.Fatal("testcgroup: a memory and a pids limit are required")
	}
	p := &Pod{UID: newUID(t)}
	levels := []string{fmt.Sprintf("/labkeep-test-%d-%d", os.Getpid(), time.Now().UnixNano()), "kubepods"}
	if qos != "" {
		levels = append(levels, qos)
	}
	levels = append(levels, "pod"+p.UID)
	var rel string
	for _, l := range levels {
		rel = filepath.Join(rel, l)
		mkdir(t, rel)
		dir := rel
		t.Cleanup(func() { Remove(t, dir) })
	}
	p.Rel = rel
	setLimits(t, rel, Limits{MemoryBytes: lim.MemoryBytes, Pids: lim.Pids})
	return p
}

// Container creates the cgroup of one container of the Pod, named by a
// fresh container ID (as containerd names it), with lim applied before
// anything runs in it, and returns its path relative to each mount. It is
// removed, with every process in it, at cleanup or by Remove.
func (p *Pod) Container(t testing.TB, lim Limits) string {
	t.Helper()
	rel := filepath.Join(p.Rel, containerID(t))
	mkdir(t, rel)
	t.Cleanup(func() {
		if _, err := os.Stat(Dir(rel, "memory")); err == nil {
			Remove(t, rel)
		}
	})
	setLimits(t, rel, lim)
	return rel
}

// newUID returns a random Pod UID.
func newUID(t testing.TB) string {
	b := randomBytes(t, 16)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// containerID returns a random 64-hex-digit container ID.
func containerID(t testing.TB) string { return fmt.Sprintf("%x", randomBytes(t, 32)) }

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
