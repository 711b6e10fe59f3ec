package cgroupfs

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// V2 is a cgroup v2 cgroup: one directory on the unified hierarchy.
type V2 struct {
	dir string
	// PSITrigger is written to memory.pressure by WatchMemory: a stall of
	// 150 ms within a 2 s window (kernels accept only whole multiples of 2 s
	// from non-RT callers).
	PSITrigger string
}

var _ Cgroup = (*V2)(nil)

// OpenV2 opens mount/rel after checking it lies inside mount/subtree.
func OpenV2(mount, subtree, rel string) (*V2, error) {
	dir, err := resolveWithin(mount, subtree, rel)
	if err != nil {
		return nil, err
	}
	return &V2{dir: dir, PSITrigger: "some 150000 2000000"}, nil
}

// Version implements Cgroup.
func (c *V2) Version() int { return 2 }

// String implements Cgroup.
func (c *V2) String() string { return "cgroup v2 " + c.dir }

// Dir returns the resolved directory.
func (c *V2) Dir() string { return c.dir }

// Procs implements Cgroup.
func (c *V2) Procs() ([]int, error) { return procsRecursive(c.dir) }

// MemoryUsage implements Cgroup.
func (c *V2) MemoryUsage() (uint64, uint64, error) {
	u, err := readUint(c.dir, "memory.current")
	if err != nil {
		return 0, 0, err
	}
	st, err := keyed(c.dir, "memory.stat")
	if err != nil {
		return 0, 0, err
	}
	return u, st["shmem"], nil
}

// MemoryLimit implements Cgroup.
func (c *V2) MemoryLimit() (uint64, error) { return readUint(c.dir, "memory.max") }

// SetMemory implements Cgroup. memory.max is lowered before memory.high is
// raised so the pair never passes through high > max.
func (c *V2) SetMemory(high, max uint64) error {
	if err := write(c.dir, "memory.max", strconv.FormatUint(max, 10)); err != nil {
		return err
	}
	return write(c.dir, "memory.high", strconv.FormatUint(high, 10))
}

// HandleOOM implements Cgroup: Kubernetes >= 1.28 sets memory.oom.group so a
// kernel OOM kills the whole container; guardian turns it off so the kernel,
// if it ever gets there first, kills one process (protected ones carry
// oom_score_adj -1000).
func (c *V2) HandleOOM() error {
	if _, err := os.Stat(file(c.dir, "memory.oom.group")); err != nil {
		return fmt.Errorf("memory.oom.group: %w", ErrUnsupported)
	}
	return write(c.dir, "memory.oom.group", "0")
}

// MemoryEvents implements Cgroup from memory.events.
func (c *V2) MemoryEvents() (MemoryEvents, error) {
	ev, err := keyed(c.dir, "memory.events")
	if err != nil {
		return MemoryEvents{}, err
	}
	return MemoryEvents{High: ev["high"], Max: ev["max"], OOM: ev["oom"], OOMKill: ev["oom_kill"]}, nil
}

// MemoryStall implements Cgroup from memory.pressure.
func (c *V2) MemoryStall() (float64, error) {
	s, err := readString(c.dir, "memory.pressure")
	if err != nil {
		return 0, err
	}
	return someAvg10(s)
}

// someAvg10 is the "some" line's avg10 of a PSI file, as a share.
func someAvg10(psi string) (float64, error) {
	for _, line := range strings.Split(psi, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "some" {
			continue
		}
		v, ok := strings.CutPrefix(f[1], "avg10=")
		if !ok {
			break
		}
		pct, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("PSI avg10 %q: %w", v, err)
		}
		return pct / 100, nil
	}
	return 0, fmt.Errorf("no \"some avg10=\" in PSI %q", psi)
}

// WatchMemory implements Cgroup: inotify on memory.events (the kernel emits
// a modify event whenever a counter grows) and, where PSI is available, a
// trigger on memory.pressure. thresholds are not used: v2 has no usage
// notifications, memory.high throttling plus events take their place.
func (c *V2) WatchMemory(ctx context.Context, _ []uint64) (<-chan struct{}, error) {
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(in, file(c.dir, "memory.events"), unix.IN_MODIFY); err != nil {
		unix.Close(in)
		return nil, fmt.Errorf("watch memory.events: %w", err)
	}
	fds := []int{in}
	if psi, err := unix.Open(file(c.dir, "memory.pressure"), unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
		if _, err := unix.Write(psi, []byte(c.PSITrigger+"\x00")); err == nil {
			fds = append(fds, psi)
		} else {
			unix.Close(psi)
		}
	}
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	return pollFDs(ctx, fds, unix.POLLIN|unix.POLLPRI, closeAll, func(fd int) {
		if fd == in {
			var buf [4096]byte
			unix.Read(fd, buf[:])
		}
	}), nil
}

// PSIWatched reports whether a PSI trigger can be registered on this cgroup
// (the kernel has PSI and the file accepts triggers).
func (c *V2) PSIWatched() bool {
	fd, err := unix.Open(file(c.dir, "memory.pressure"), unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(c.PSITrigger+"\x00"))
	return err == nil
}

// SetPidsMax implements Cgroup.
func (c *V2) SetPidsMax(n int) error { return write(c.dir, "pids.max", strconv.Itoa(n)) }

// PidsLimit implements Cgroup.
func (c *V2) PidsLimit() (int, error) {
	v, err := readUint(c.dir, "pids.max")
	return int(v), err
}

// PidsRefused implements Cgroup.
func (c *V2) PidsRefused() (uint64, error) {
	ev, err := keyed(c.dir, "pids.events")
	if err != nil {
		return 0, err
	}
	return ev["max"], nil
}

// PidsCurrent implements Cgroup.
func (c *V2) PidsCurrent() (int, error) {
	v, err := readUint(c.dir, "pids.current")
	return int(v), err
}

// WatchPids implements Cgroup with inotify on pids.events, whose "max"
// counter the kernel raises (and notifies) at every fork refused at
// pids.max in the cgroup or below it.
func (c *V2) WatchPids(ctx context.Context) (<-chan struct{}, error) {
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(in, file(c.dir, "pids.events"), unix.IN_MODIFY); err != nil {
		unix.Close(in)
		return nil, fmt.Errorf("watch pids.events: %w", err)
	}
	return pollFDs(ctx, []int{in}, unix.POLLIN, func() { unix.Close(in) }, func(fd int) {
		var buf [4096]byte
		unix.Read(fd, buf[:])
	}), nil
}

// Freeze implements Cgroup with cgroup.freeze, waiting for "frozen 1" in
// cgroup.events.
func (c *V2) Freeze(ctx context.Context) error {
	if err := write(c.dir, "cgroup.freeze", "1"); err != nil {
		return err
	}
	return waitFor(ctx, func() (bool, error) {
		ev, err := keyed(c.dir, "cgroup.events")
		if err != nil {
			return false, err
		}
		return ev["frozen"] == 1, nil
	})
}

// Thaw implements Cgroup.
func (c *V2) Thaw() error { return write(c.dir, "cgroup.freeze", "0") }

// Kill kills every process in the cgroup through cgroup.kill, protected or
// not; guardian never uses it on the workspace (sshd lives there), the test
// harness uses it to tear down.
func (c *V2) Kill() error { return write(c.dir, "cgroup.kill", "1") }

// CPUUsage implements Cgroup from cpu.stat usage_usec.
func (c *V2) CPUUsage() (time.Duration, error) {
	st, err := keyed(c.dir, "cpu.stat")
	if err != nil {
		return 0, err
	}
	return time.Duration(st["usage_usec"]) * time.Microsecond, nil
}

// CPUs implements Cgroup from cpu.max ("max 100000" or "50000 100000").
func (c *V2) CPUs() (float64, error) {
	s, err := readString(c.dir, "cpu.max")
	if os.IsNotExist(err) {
		return 0, nil // cpu controller not enabled here: no quota
	}
	if err != nil {
		return 0, err
	}
	f := strings.Fields(s)
	if len(f) != 2 || f[0] == "max" {
		return 0, nil
	}
	q, err1 := strconv.ParseFloat(f[0], 64)
	p, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || p == 0 {
		return 0, fmt.Errorf("cpu.max %q: unparsable", s)
	}
	return q / p, nil
}

// CPUWeight implements Cgroup from cpu.weight.
func (c *V2) CPUWeight() (int, error) {
	v, err := readUint(c.dir, "cpu.weight")
	if os.IsNotExist(err) {
		return 0, nil // cpu controller not enabled here
	}
	return int(v), err
}

// SetCPUWeight implements Cgroup.
func (c *V2) SetCPUWeight(weight int) error {
	if err := validWeight(weight); err != nil {
		return err
	}
	return write(c.dir, "cpu.weight", strconv.Itoa(weight))
}

// GrantRT implements Cgroup: cgroup v2 has no RT group budget.
func (c *V2) GrantRT(int) error { return nil }
