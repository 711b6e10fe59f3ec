// Package cgroupfs drives the workspace container's cgroup through the
// cgroup filesystem, for cgroup v1 (one mount per controller) and v2 (one
// unified directory) behind one interface. Every path is resolved and
// checked to lie inside the allowed subtree (the Pod's cgroup) before it is
// used, so a symlink or a ".." can never make guardian write elsewhere.
package cgroupfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrOutsideSubtree is returned when a cgroup path resolves outside the
// subtree guardian is allowed to touch.
var ErrOutsideSubtree = errors.New("cgroup path outside the allowed subtree")

// ErrUnsupported is returned for a knob the cgroup version or the kernel
// does not have.
var ErrUnsupported = errors.New("not supported by this cgroup hierarchy")

// MemoryEvents are the kernel's memory event counters for the cgroup.
type MemoryEvents struct {
	High     uint64 // v2: times usage went over memory.high
	Max      uint64 // v2: times usage hit memory.max; v1: memory.failcnt
	OOM      uint64 // v2: times the OOM condition was reached
	OOMKill  uint64 // processes the kernel OOM killer killed (v1: memory.oom_control oom_kill)
	UnderOOM bool   // v1: tasks are waiting at the limit (oom_kill_disable is on)
}

// Cgroup is the workspace container's cgroup. Setters change kernel state
// that outlives guardian; nothing here is undone when guardian exits.
type Cgroup interface {
	// Version is 1 or 2.
	Version() int
	// String names the cgroup for logs.
	String() string
	// Procs lists the PIDs of every process in the cgroup and its children.
	Procs() ([]int, error)
	// MemoryUsage returns current usage and the shmem (tmpfs, shm) part of it in bytes.
	MemoryUsage() (usage, shmem uint64, err error)
	// MemoryLimit returns the hard limit in bytes (0 when unlimited).
	MemoryLimit() (uint64, error)
	// SetMemory sets the throttling limit (v2 memory.high; v1 the soft
	// limit) and the hard limit (v2 memory.max; v1 memory.limit_in_bytes).
	SetMemory(high, max uint64) error
	// HandleOOM lets guardian, not the kernel, choose the victim at the hard
	// limit where the hierarchy allows it: on v1 it disables the kernel OOM
	// killer for the cgroup (tasks wait at the limit until guardian frees
	// memory); on v2 it turns memory.oom.group off so a kernel OOM kills one
	// process instead of the whole container.
	HandleOOM() error
	// MemoryEvents reads the memory event counters.
	MemoryEvents() (MemoryEvents, error)
	// MemoryStall is the share (0 to 1) of the last 10 s in which some of
	// the cgroup's tasks stalled on memory: memory.pressure's "some
	// avg10" (v2 with PSI; ErrUnsupported on v1).
	MemoryStall() (float64, error)
	// WatchMemory delivers a value on the returned channel whenever the
	// kernel reports memory news: usage crossing one of thresholds (v1
	// eventfd notifications), an OOM condition, a change of memory.events or
	// a PSI trigger on memory.pressure (v2). The channel closes when ctx ends.
	WatchMemory(ctx context.Context, thresholds []uint64) (<-chan struct{}, error)
	// SetPidsMax sets the kernel's hard limit on processes.
	SetPidsMax(n int) error
	// PidsLimit reads pids.max (0 when unlimited).
	PidsLimit() (int, error)
	// PidsRefused returns how many forks the kernel refused at pids.max.
	PidsRefused() (uint64, error)
	// PidsCurrent reads pids.current: the tasks charged against pids.max,
	// threads and not yet reaped zombies included.
	PidsCurrent() (int, error)
	// WatchPids delivers a value on the returned channel whenever the
	// kernel notifies a change of pids.events (a fork refused at
	// pids.max), and closes it when ctx ends. Only cgroup v2 notifies: on
	// v1 the kernel counts refusals in pids.events but sends the
	// notification to pids.events.local, a file v1 does not have (checked
	// on Linux 6.18), so V1 returns ErrUnsupported and callers poll.
	WatchPids(ctx context.Context) (<-chan struct{}, error)
	// Freeze stops every task and waits until the kernel reports the cgroup frozen.
	Freeze(ctx context.Context) error
	// Thaw resumes the tasks.
	Thaw() error
	// CPUUsage returns the CPU time consumed by the cgroup so far.
	CPUUsage() (time.Duration, error)
	// CPUs returns the CFS quota in CPUs, or 0 when there is no quota.
	CPUs() (float64, error)
	// CPUWeight reads the cgroup's CPU weight against its siblings in
	// cgroup v2 units, 1 to 10000 (v1 cpu.shares converted as the kubelet
	// converts them); 0 when the cpu controller is not enabled for it.
	CPUWeight() (int, error)
	// SetCPUWeight sets that weight (v1: cpu.shares converted back).
	SetCPUWeight(weight int) error
	// GrantRT gives the cgroup a real-time budget (v1 cpu.rt_runtime_us)
	// so that SCHED_RR is allowed inside it, setting each level from the
	// subtree root down. Returns an error when the hierarchy refuses; v2 has
	// no RT group budget and returns nil.
	GrantRT(runtimeUS int) error
}

// resolveWithin joins rel to mount, resolves symlinks and checks the result
// lies inside mount/subtree (itself resolved). It returns the resolved
// directory.
func resolveWithin(mount, subtree, rel string) (string, error) {
	rootMount, err := filepath.EvalSymlinks(mount)
	if err != nil {
		return "", fmt.Errorf("cgroup mount %s: %w", mount, err)
	}
	allowed, err := filepath.EvalSymlinks(filepath.Join(rootMount, filepath.Clean("/"+subtree)))
	if err != nil {
		return "", fmt.Errorf("cgroup subtree %s: %w", subtree, err)
	}
	if !within(rootMount, allowed) {
		return "", fmt.Errorf("subtree %s: %w", subtree, ErrOutsideSubtree)
	}
	// rel is joined without Clean("/"+rel) so that ".." cannot silently be
	// clamped at the root: it is resolved and checked like any other path.
	dir, err := filepath.EvalSymlinks(filepath.Join(rootMount, rel))
	if err != nil {
		return "", fmt.Errorf("cgroup %s: %w", rel, err)
	}
	if !within(allowed, dir) {
		return "", fmt.Errorf("cgroup %s resolves to %s, not under %s: %w", rel, dir, allowed, ErrOutsideSubtree)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("cgroup %s is not a directory", dir)
	}
	return dir, nil
}

func within(parent, p string) bool {
	if p == parent {
		return true
	}
	return strings.HasPrefix(p, strings.TrimSuffix(parent, "/")+"/")
}

// file returns dir/name after checking name is a plain file name.
func file(dir, name string) string {
	if name == "" || strings.ContainsRune(name, '/') || name == ".." || name == "." {
		panic("cgroupfs: bad knob name " + name)
	}
	return filepath.Join(dir, name)
}

func readString(dir, name string) (string, error) {
	b, err := os.ReadFile(file(dir, name))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func readUint(dir, name string) (uint64, error) {
	s, err := readString(dir, name)
	if err != nil {
		return 0, err
	}
	if s == "max" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", file(dir, name), err)
	}
	return v, nil
}

func write(dir, name, value string) error {
	f, err := os.OpenFile(file(dir, name), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, file(dir, name), err)
	}
	return nil
}

// keyed parses "key value" lines (memory.stat, memory.events, cpu.stat,
// pids.events, memory.oom_control).
func keyed(dir, name string) (map[string]uint64, error) {
	s, err := readString(dir, name)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			out[f[0]] = v
		}
	}
	return out, nil
}

// procsRecursive reads cgroup.procs of dir and every child cgroup.
func procsRecursive(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p != dir && errors.Is(err, os.ErrNotExist) {
				return nil // a child cgroup removed while walking
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			if p != dir && errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}

// waitFor polls cond every 5 ms until it holds or ctx ends.
func waitFor(ctx context.Context, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// The v1 cpu.shares and v2 cpu.weight ranges, and the kubelet's mapping
// between them (cm.CPUSharesToCPUWeight), so a weight reads back as it was
// set on either version.
const (
	minShares, maxShares = 2, 262144
	minWeight, maxWeight = 1, 10000
)

func sharesToWeight(shares uint64) int {
	shares = min(max(shares, minShares), maxShares)
	return int(1 + ((shares-2)*9999)/262142)
}

func weightToShares(weight int) uint64 {
	return uint64(2 + ((weight-1)*262142+9998)/9999)
}

// validWeight refuses a weight outside cpu.weight's range.
func validWeight(weight int) error {
	if weight < minWeight || weight > maxWeight {
		return fmt.Errorf("CPU weight %d outside %d…%d", weight, minWeight, maxWeight)
	}
	return nil
}
