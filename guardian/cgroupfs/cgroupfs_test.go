package cgroupfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"labkeep/guardian/internal/poll"
	"labkeep/guardian/internal/testcgroup"
)

func mkfile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestResolveWithinRefusesEscapes(t *testing.T) {
	root := t.TempDir()
	mount := filepath.Join(root, "cg")
	for _, d := range []string{"kubepods/podA/ws", "kubepods/podB/other", "elsewhere"} {
		if err := os.MkdirAll(filepath.Join(mount, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(mount, "kubepods/podB/other"), filepath.Join(mount, "kubepods/podA/escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(mount, "kubepods/podA/ws"), filepath.Join(mount, "kubepods/podA/alias")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, subtree, rel string
		wantErr            error
	}{
		{"the container inside the pod", "/kubepods/podA", "/kubepods/podA/ws", nil},
		{"the pod itself", "/kubepods/podA", "/kubepods/podA", nil},
		{"a symlink that stays inside is fine", "/kubepods/podA", "/kubepods/podA/alias", nil},
		{"a symlink out of the pod", "/kubepods/podA", "/kubepods/podA/escape", ErrOutsideSubtree},
		{"dot-dot out of the pod", "/kubepods/podA", "/kubepods/podA/../podB/other", ErrOutsideSubtree},
		{"dot-dot out of the mount", "/kubepods/podA", "/kubepods/podA/../../../../etc", os.ErrNotExist},
		{"a sibling pod", "/kubepods/podA", "/kubepods/podB/other", ErrOutsideSubtree},
		{"a prefix-sharing name is not inside", "/kubepods/pod", "/kubepods/podA", os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := resolveWithin(mount, tt.subtree, tt.rel)
			if tt.wantErr == nil && err != nil {
				t.Fatalf("resolveWithin() error = %v; want nil", err)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("resolveWithin() error = %v; want %v", err, tt.wantErr)
			}
		})
	}
	t.Run("etc escape is refused even when the target exists", func(t *testing.T) {
		_, err := resolveWithin(mount, "/kubepods/podA", "/kubepods/podA/../../elsewhere")
		if !errors.Is(err, ErrOutsideSubtree) {
			t.Fatalf("error = %v; want ErrOutsideSubtree", err)
		}
	})
}

// v2Fixture lays out the v2 files of a container cgroup as the kernel would.
func v2Fixture(t *testing.T) (mount string, c *V2) {
	t.Helper()
	mount = t.TempDir()
	d := filepath.Join(mount, "kubepods.slice/pod.slice/ws.scope")
	files := map[string]string{
		"memory.current":     "943718400\n",
		"memory.max":         "1073741824\n",
		"memory.high":        "max\n",
		"memory.oom.group":   "1\n",
		"memory.stat":        "anon 800000000\nfile 100000\nshmem 123456\n",
		"memory.events":      "low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n",
		"memory.pressure":    "some avg10=38.95 avg60=7.21 avg300=1.60 total=9158375\nfull avg10=7.21 avg60=1.50 avg300=0.33 total=1770343\n",
		"pids.max":           "max\n",
		"pids.events":        "max 42\n",
		"cpu.max":            "50000 100000\n",
		"cpu.weight":         "39\n",
		"cpu.stat":           "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
		"cgroup.procs":       "10\n11\n",
		"child/cgroup.procs": "12\n",
	}
	for name, content := range files {
		mkfile(t, filepath.Join(d, name), content)
	}
	c, err := OpenV2(mount, "/kubepods.slice/pod.slice", "/kubepods.slice/pod.slice/ws.scope")
	if err != nil {
		t.Fatal(err)
	}
	return mount, c
}

func TestV2Fixture(t *testing.T) {
	_, c := v2Fixture(t)
	d := c.Dir()

	usage, shmem, err := c.MemoryUsage()
	if err != nil || usage != 943718400 || shmem != 123456 {
		t.Errorf("MemoryUsage() = %d,%d,%v", usage, shmem, err)
	}
	if lim, err := c.MemoryLimit(); err != nil || lim != 1<<30 {
		t.Errorf("MemoryLimit() = %d,%v", lim, err)
	}
	if err := c.SetMemory(966367641, 1052266987); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(d, "memory.high")); got != "966367641" {
		t.Errorf("memory.high = %s", got)
	}
	if got := readFile(t, filepath.Join(d, "memory.max")); got != "1052266987" {
		t.Errorf("memory.max = %s", got)
	}
	if err := c.HandleOOM(); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(d, "memory.oom.group")); got != "0" {
		t.Errorf("memory.oom.group = %s; want 0", got)
	}
	ev, err := c.MemoryEvents()
	if diff := cmp.Diff(MemoryEvents{High: 12, Max: 3, OOM: 1, OOMKill: 1}, ev); diff != "" || err != nil {
		t.Errorf("MemoryEvents() err=%v (-want +got):\n%s", err, diff)
	}
	if st, err := c.MemoryStall(); err != nil || st != 0.3895 {
		t.Errorf("MemoryStall() = %v,%v; want 0.3895 (some avg10)", st, err)
	}
	if err := c.SetPidsMax(4096); err != nil {
		t.Fatal(err)
	}
	if n, err := c.PidsLimit(); err != nil || n != 4096 {
		t.Errorf("PidsLimit() = %d,%v", n, err)
	}
	if n, err := c.PidsRefused(); err != nil || n != 42 {
		t.Errorf("PidsRefused() = %d,%v", n, err)
	}
	if cpus, err := c.CPUs(); err != nil || cpus != 0.5 {
		t.Errorf("CPUs() = %v,%v", cpus, err)
	}
	if w, err := c.CPUWeight(); err != nil || w != 39 {
		t.Errorf("CPUWeight() = %v,%v", w, err)
	}
	if err := c.SetCPUWeight(1); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(d, "cpu.weight")); got != "1" {
		t.Errorf("cpu.weight = %s; want 1", got)
	}
	if err := c.SetCPUWeight(0); err == nil {
		t.Errorf("SetCPUWeight(0) = nil; want an error (cpu.weight's range is 1 to 10000)")
	}
	if u, err := c.CPUUsage(); err != nil || u != 1500*time.Millisecond {
		t.Errorf("CPUUsage() = %v,%v", u, err)
	}
	pids, err := c.Procs()
	if diff := cmp.Diff([]int{10, 11, 12}, pids); diff != "" || err != nil {
		t.Errorf("Procs() err=%v (-want +got):\n%s", err, diff)
	}
}

// A weight survives the trip through v1's cpu.shares (the kubelet's
// mapping), over cpu.weight's whole range.
func TestCPUWeightThroughShares(t *testing.T) {
	for w := minWeight; w <= maxWeight; w++ {
		if got := sharesToWeight(weightToShares(w)); got != w {
			t.Fatalf("weight %d → shares %d → weight %d", w, weightToShares(w), got)
		}
	}
	for _, tc := range []struct {
		shares uint64
		want   int
	}{{0, 1}, {2, 1}, {102, 4}, {1024, 39}, {262144, 10000}, {1 << 20, 10000}} {
		if got := sharesToWeight(tc.shares); got != tc.want {
			t.Errorf("sharesToWeight(%d) = %d; want %d", tc.shares, got, tc.want)
		}
	}
}

func TestV2WatchMemoryEventsFixture(t *testing.T) {
	_, c := v2Fixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := c.WatchMemory(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel rewrites memory.events when a counter grows; inotify sees
	// the same modification on the fixture.
	mkfile(t, filepath.Join(c.Dir(), "memory.events"), "low 0\nhigh 13\nmax 3\noom 1\noom_kill 1\n")
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no notification after memory.events changed")
	}
	cancel()
	for range ch {
	}
}

func TestV2RealFreezeAndPSI(t *testing.T) {
	dir := testcgroup.NewV2(t)
	c, err := OpenV2(testcgroup.V2Root, strings.TrimPrefix(dir, testcgroup.V2Root), strings.TrimPrefix(dir, testcgroup.V2Root))
	if err != nil {
		t.Fatal(err)
	}
	cmd := testcgroup.CommandV2(dir, "/bin/sh", "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitProcs(t, c, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Freeze(ctx); err != nil {
		t.Fatalf("Freeze() = %v", err)
	}
	u1, _ := c.CPUUsage()
	time.Sleep(200 * time.Millisecond)
	u2, _ := c.CPUUsage()
	if u2 != u1 {
		t.Errorf("CPU usage grew from %v to %v while frozen", u1, u2)
	}
	if err := c.Thaw(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if u3, _ := c.CPUUsage(); u3 <= u2 {
		t.Errorf("CPU usage did not grow after thaw: %v then %v", u2, u3)
	}
	if _, err := os.Stat(filepath.Join(dir, "memory.pressure")); err == nil {
		if !c.PSIWatched() {
			t.Errorf("memory.pressure exists but refuses a PSI trigger")
		}
		if st, err := c.MemoryStall(); err != nil || st < 0 || st > 1 {
			t.Errorf("MemoryStall() = %v,%v; want a share in [0,1]", st, err)
		}
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	waitProcs(t, c, 0)
}

func waitProcs(t *testing.T, c Cgroup, n int) {
	t.Helper()
	poll.Eventually(t, 5*time.Second, func() (bool, string) {
		p, err := c.Procs()
		return err == nil && len(p) == n, fmt.Sprintf("cgroup has %v processes; want %d (err %v)", p, n, err)
	})
}

func openV1(t *testing.T, rel string) *V1 {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mounts, _ := MountsV1(string(mi))
	c, err := OpenV1(mounts, rel, rel)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestV1Real(t *testing.T) {
	const limit = 256 << 20
	rel := testcgroup.NewV1(t, testcgroup.Limits{MemoryBytes: limit, Pids: 64, CPUs: 0.5})
	c := openV1(t, rel)

	if lim, err := c.MemoryLimit(); err != nil || lim != limit {
		t.Fatalf("MemoryLimit() = %d,%v", lim, err)
	}
	if err := c.SetMemory(limit*90/100, limit*98/100); err != nil {
		t.Fatal(err)
	}
	// The kernel rounds limits to pages.
	if lim, _ := c.MemoryLimit(); lim > limit*98/100 || lim < limit*98/100-4096 {
		t.Errorf("limit after SetMemory = %d", lim)
	}
	if err := c.SetPidsMax(32); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.PidsLimit(); n != 32 {
		t.Errorf("pids.max = %d", n)
	}
	if cpus, err := c.CPUs(); err != nil || cpus != 0.5 {
		t.Errorf("CPUs() = %v,%v", cpus, err)
	}
	for _, tc := range []struct {
		weight int
		shares string
	}{{1, "2"}, {39, "999"}, {10000, "262144"}} {
		if err := c.SetCPUWeight(tc.weight); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, filepath.Join(c.Dir("cpu"), "cpu.shares")); got != tc.shares {
			t.Errorf("cpu.shares after SetCPUWeight(%d) = %s; want %s", tc.weight, got, tc.shares)
		}
		if w, err := c.CPUWeight(); err != nil || w != tc.weight {
			t.Errorf("CPUWeight() after SetCPUWeight(%d) = %d,%v", tc.weight, w, err)
		}
	}
	if err := c.GrantRT(10000); err != nil {
		t.Errorf("GrantRT() = %v", err)
	}
	if got := readFile(t, filepath.Join(c.Dir("cpu"), "cpu.rt_runtime_us")); got != "10000" {
		t.Errorf("cpu.rt_runtime_us = %s", got)
	}
	if err := c.HandleOOM(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := c.WatchMemory(ctx, []uint64{64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// A hog of 100 MiB crosses the 64 MiB threshold: the eventfd fires.
	hog := testcgroup.Command(rel, "/bin/sh", "-c", "head -c 100M /dev/zero | tail > /dev/null; sleep 60")
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hog.Process.Kill(); hog.Wait() })
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no threshold notification")
	}
	// The kernel signals the crossing, not a level that lasts: usage may
	// already have dropped (pages reclaimed, tail done). Its high-water
	// mark, on the same page counter the threshold is checked against,
	// cannot drop and must have reached the threshold.
	peak, err := strconv.ParseUint(readFile(t, filepath.Join(c.Dir("memory"), "memory.max_usage_in_bytes")), 10, 64)
	if err != nil || peak < 64<<20 {
		t.Errorf("memory.max_usage_in_bytes = %d,%v after the 64 MiB threshold fired", peak, err)
	}

	pids, err := c.Procs()
	if err != nil || len(pids) == 0 {
		t.Fatalf("Procs() = %v,%v", pids, err)
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer fcancel()
	if err := c.Freeze(fctx); err != nil {
		t.Fatalf("Freeze() = %v", err)
	}
	if s := readFile(t, filepath.Join(c.Dir("freezer"), "freezer.state")); s != "FROZEN" {
		t.Errorf("freezer.state = %s", s)
	}
	if err := c.Thaw(); err != nil {
		t.Fatal(err)
	}
	if s := readFile(t, filepath.Join(c.Dir("freezer"), "freezer.state")); s != "THAWED" {
		t.Errorf("freezer.state = %s", s)
	}
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	ev, err := c.MemoryEvents()
	if err != nil || ev.OOMKill != 0 {
		t.Errorf("MemoryEvents() = %+v,%v", ev, err)
	}
}

func TestV1PidsRefusedReal(t *testing.T) {
	rel := testcgroup.NewV1(t, testcgroup.Limits{MemoryBytes: 64 << 20, Pids: 5})
	c := openV1(t, rel)
	before, err := c.PidsRefused()
	if err != nil {
		t.Fatal(err)
	}
	cmd := testcgroup.Command(rel, "/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 30 & done; wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	poll.Eventually(t, 5*time.Second, func() (bool, string) {
		n, _ := c.PidsRefused()
		return n > before, fmt.Sprintf("pids.events max stayed at %d", n)
	})
}

func TestMountsV1(t *testing.T) {
	mi := `30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory`
	v1, v2 := MountsV1(mi)
	if v2 != "/sys/fs/cgroup/unified" {
		t.Errorf("v2 = %q", v2)
	}
	want := map[string]string{"rw": "/sys/fs/cgroup/cpu,cpuacct", "cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct", "memory": "/sys/fs/cgroup/memory"}
	if diff := cmp.Diff(want, v1); diff != "" {
		t.Errorf("MountsV1() (-want +got):\n%s", diff)
	}
}

func TestFindPod(t *testing.T) {
	const uid = "0f3c2a51-6b7e-4c1d-9a8b-1234567890ab"
	layouts := []struct {
		name, pod string
	}{
		{"cgroupfs driver", "kubepods/burstable/pod" + uid},
		{"systemd driver", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"},
		{"guaranteed QoS, cgroupfs driver", "kubepods/pod" + uid},
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			mount := t.TempDir()
			mkfile(t, filepath.Join(mount, l.pod, "aaaa", "cgroup.procs"), "")
			mkfile(t, filepath.Join(mount, "kubepods/burstable/podother/x/cgroup.procs"), "")
			pod, err := FindPod(mount, uid)
			if err != nil || pod != "/"+l.pod {
				t.Fatalf("FindPod() = %q,%v; want /%s", pod, err, l.pod)
			}
		})
	}
	t.Run("malformed uid is refused", func(t *testing.T) {
		if _, err := FindPod(t.TempDir(), "../../etc"); err == nil {
			t.Fatal("FindPod accepted a malformed POD_UID")
		}
	})
	t.Run("unknown pod", func(t *testing.T) {
		if _, err := FindPod(t.TempDir(), uid); !errors.Is(err, ErrNotFound) {
			t.Fatalf("error = %v; want ErrNotFound", err)
		}
	})
}

func TestClassify(t *testing.T) {
	const self, sandbox = 40, 1
	marked := map[int]bool{20: true, 40: true}
	tests := []struct {
		name string
		pids []int
		want Role
	}{
		{"no process: not started, gone, or another PID namespace", nil, RoleEmpty},
		{"guardian's own cgroup, even when something in it carries the marker", []int{40, 41}, RoleSelf},
		{"the sandbox holds PID 1", []int{1}, RoleSandbox},
		{"a process with the marker", []int{21, 20}, RoleWorkspace},
		{"processes without the marker (another container, or the runtime's init before exec)", []int{30, 31}, RoleOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.pids, self, sandbox, func(pid int) bool { return marked[pid] }); got != tt.want {
				t.Errorf("Classify(%v) = %q; want %q", tt.pids, got, tt.want)
			}
		})
	}
}

func TestPickWorkspace(t *testing.T) {
	tests := []struct {
		name        string
		cs          []Container
		want        string
		wantErr     bool
		wantMissing bool
	}{
		{"the one marked container", []Container{{"/p/a", RoleSandbox}, {"/p/b", RoleSelf}, {"/p/c", RoleWorkspace}}, "/p/c", false, false},
		{"the one app container, its marker hidden (sshd's process title)", []Container{{"/p/a", RoleSandbox}, {"/p/b", RoleSelf}, {"/p/c", RoleOther}, {"/p/e", RoleEmpty}}, "/p/c", false, false},
		{"none yet: guardian started first", []Container{{"/p/a", RoleSandbox}, {"/p/b", RoleSelf}, {"/p/e", RoleEmpty}}, "", true, true},
		{"guardian's own cgroup is never the workspace", []Container{{"/p/b", RoleSelf}}, "", true, true},
		{"a debug container beside the workspace: the marker decides", []Container{{"/p/c", RoleOther}, {"/p/d", RoleWorkspace}}, "/p/d", false, false},
		{"a debug container beside an unmarked workspace is refused", []Container{{"/p/c", RoleOther}, {"/p/d", RoleOther}}, "", true, false},
		{"two marked containers are refused", []Container{{"/p/c", RoleWorkspace}, {"/p/d", RoleWorkspace}}, "", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PickWorkspace(tt.cs)
			if got != tt.want || (err != nil) != tt.wantErr || errors.Is(err, ErrNotFound) != tt.wantMissing {
				t.Errorf("PickWorkspace() = %q,%v; want %q, error %v, ErrNotFound %v", got, err, tt.want, tt.wantErr, tt.wantMissing)
			}
		})
	}
}

// podFixture lays out a Pod's container cgroups under mount (knob files
// included, as Open needs) and the processes in them under proc.
type podFixture struct {
	mount, proc, pod string
}

func newPodFixture(t *testing.T, pod string) *podFixture {
	t.Helper()
	f := &podFixture{mount: t.TempDir(), proc: t.TempDir(), pod: pod}
	mkfile(t, filepath.Join(f.mount, "kubepods/burstable/podother/x/cgroup.procs"), "")
	return f
}

// container creates the container's cgroup with its processes, each
// given by pid → environment.
func (f *podFixture) container(t *testing.T, id string, procs map[string][]string) string {
	t.Helper()
	var pids []string
	for pid, env := range procs {
		pids = append(pids, pid)
		fakeProc(t, f.proc, pid, "/bin/x", env...)
	}
	mkfile(t, filepath.Join(f.mount, f.pod, id, "cgroup.procs"), strings.Join(pids, "\n"))
	for _, knob := range []string{"memory.max", "memory.high", "pids.max"} {
		mkfile(t, filepath.Join(f.mount, f.pod, id, knob), "max\n")
	}
	return "/" + filepath.Join(f.pod, id)
}

// A Pod as the kubelet lays it out on cgroup v2 (systemd driver and
// cgroupfs driver) and v1 (cgroupfs driver): the sandbox, guardian (its
// own cgroup known only by its PID: under a private cgroup namespace
// /proc/self/cgroup says "0::/"), and the workspace once it runs.
func TestPodWorkspaceFixtures(t *testing.T) {
	const uid = "0f3c2a51-6b7e-4c1d-9a8b-1234567890ab"
	layouts := []struct {
		name, pod, sandbox, guardian, workspace string
	}{
		{"v2 systemd driver", "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice",
			"cri-containerd-5a4d.scope", "cri-containerd-9e1f.scope", "cri-containerd-c0de.scope"},
		{"v2 cgroupfs driver", "kubepods/pod" + uid, "5a4d", "9e1f", "c0de"},
		{"v1 cgroupfs driver", "kubepods/burstable/pod" + uid, "5a4d", "9e1f", "c0de"},
	}
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			f := newPodFixture(t, l.pod)
			f.container(t, l.sandbox, map[string][]string{"1": nil})
			f.container(t, l.guardian, map[string][]string{"7": {"CONTAINER_NAME=workspace"}})
			w := &PodWorkspace{Layout: Layout{V2: f.mount}, ProcRoot: f.proc, PodUID: uid, ContainerName: "workspace", SelfPID: 7, SandboxPID: 1}
			if strings.HasPrefix(l.name, "v1") {
				w.Layout = Layout{V1: map[string]string{"memory": f.mount}}
			}
			_, _, seen, err := w.Locate()
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("Locate() before the workspace started = %v; want ErrNotFound", err)
			}
			wantSeen := []Container{{"/" + l.pod + "/" + l.sandbox, RoleSandbox}, {"/" + l.pod + "/" + l.guardian, RoleSelf}}
			if diff := cmp.Diff(wantSeen, seen); diff != "" {
				t.Errorf("containers before the workspace started (-want +got):\n%s", diff)
			}
			// sshd's process title hides the marker: the one app container
			// is the workspace all the same.
			ws := f.container(t, l.workspace, map[string][]string{"30": {"sshd: /usr/sbin/sshd -D [listener]"}})
			got, pod, _, err := w.Locate()
			if err != nil || got != ws || pod != "/"+l.pod {
				t.Fatalf("Locate() = %q, %q, %v; want %q in /%s", got, pod, err, ws, l.pod)
			}
			// An ephemeral debug container joins: the marker decides.
			f.container(t, "debug", map[string][]string{"40": {"PATH=/bin"}})
			if _, _, _, err := w.Locate(); err == nil {
				t.Fatalf("Locate() with an unmarked workspace and a debug container guessed")
			}
			f.container(t, l.workspace, map[string][]string{"30": {"sshd: /usr/sbin/sshd -D [listener]"}, "31": {"PATH=/bin", "LABKEEP_CONTAINER_NAME=workspace"}})
			if got, _, _, err = w.Locate(); err != nil || got != ws {
				t.Fatalf("Locate() with a marked workspace and a debug container = %q, %v; want %q", got, err, ws)
			}
			if strings.HasPrefix(l.name, "v1") {
				return // Open on v1 needs every controller: the real-cgroup tests cover it
			}
			cg, err := w.Find()
			if err != nil {
				t.Fatal(err)
			}
			if err := cg.SetPidsMax(4096); err != nil {
				t.Fatal(err)
			}
			if got := readFile(t, filepath.Join(f.mount, ws, "pids.max")); got != "4096" {
				t.Errorf("pids.max = %s", got)
			}
			other := &PodWorkspace{Layout: w.Layout, ProcRoot: f.proc, PodUID: uid, ContainerName: "nosuch", SelfPID: 7, SandboxPID: 1}
			if _, err := other.Find(); err == nil {
				t.Errorf("Find(container name no process carries) among two app containers guessed")
			}
		})
	}
}

func TestExplicitFind(t *testing.T) {
	mount := t.TempDir()
	mkfile(t, filepath.Join(mount, "pod/ws/pids.max"), "max\n")
	layout := Layout{V2: mount}
	tests := []struct {
		name          string
		subtree, path string
		wantErr       error
	}{
		{"relative to the mount", "/pod", "/pod/ws", nil},
		{"absolute under the mount", "/pod", filepath.Join(mount, "pod/ws"), nil},
		{"outside the subtree", "/pod", "/", ErrOutsideSubtree},
		{"not there (yet)", "/pod", "/pod/later", ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Explicit{Layout: layout, Subtree: tt.subtree, Path: tt.path}.Find()
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("Find() = %v; want %v", err, tt.wantErr)
			}
		})
	}
	if _, err := Open(layout, "", ""); err == nil {
		t.Error("Open(\"\") accepted no cgroup")
	}
}
