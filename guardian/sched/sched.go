// Package sched sets the CPU scheduling of protected processes: SCHED_RR
// with SCHED_RESET_ON_FORK for the sshd listener (its children go back to
// normal scheduling, so a user's shell cannot inherit real-time priority),
// and a nice value with SCHED_RESET_ON_FORK as the fallback where
// real-time is refused.
package sched

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Attr is the scheduling state of a process.
type Attr struct {
	Policy      int  // unix.SCHED_NORMAL, SCHED_RR, ...
	ResetOnFork bool // SCHED_RESET_ON_FORK
	Priority    int  // real-time priority
	Nice        int
}

// IsRR reports whether the attributes are SCHED_RR at priority prio with
// reset-on-fork, the state the protector wants for the listener.
func (a Attr) IsRR(prio int) bool {
	return a.Policy == unix.SCHED_RR && a.ResetOnFork && a.Priority == prio
}

// Get reads the scheduling attributes of pid.
func Get(pid int) (Attr, error) {
	sa, err := unix.SchedGetAttr(pid, 0)
	if err != nil {
		return Attr{}, fmt.Errorf("sched_getattr %d: %w", pid, err)
	}
	return Attr{
		Policy:      int(sa.Policy),
		ResetOnFork: sa.Flags&unix.SCHED_FLAG_RESET_ON_FORK != 0,
		Priority:    int(sa.Priority),
		Nice:        int(sa.Nice),
	}, nil
}

// SetRR puts pid under SCHED_RR|SCHED_RESET_ON_FORK at priority prio. The
// kernel refuses (EPERM) without CAP_SYS_NICE, or when the task's cgroup has
// no RT budget (cpu.rt_runtime_us 0 under RT group scheduling).
func SetRR(pid, prio int) error {
	attr := unix.SchedAttr{
		Size:     uint32(unsafe.Sizeof(unix.SchedAttr{})),
		Policy:   unix.SCHED_RR,
		Flags:    unix.SCHED_FLAG_RESET_ON_FORK,
		Priority: uint32(prio),
	}
	if err := unix.SchedSetAttr(pid, &attr, 0); err != nil {
		return fmt.Errorf("SCHED_RR for %d: %w", pid, err)
	}
	return nil
}

// SetOther puts pid under SCHED_OTHER at nice with SCHED_RESET_ON_FORK:
// the processes it forks start at nice 0, so the user's shells and jobs
// under a reniced sshd do not inherit its priority. It also takes a
// real-time process back to normal scheduling. A negative nice needs
// CAP_SYS_NICE.
func SetOther(pid, nice int) error {
	attr := unix.SchedAttr{
		Size:   uint32(unsafe.Sizeof(unix.SchedAttr{})),
		Policy: unix.SCHED_NORMAL,
		Flags:  unix.SCHED_FLAG_RESET_ON_FORK,
		Nice:   int32(nice),
	}
	if err := unix.SchedSetAttr(pid, &attr, 0); err != nil {
		return fmt.Errorf("SCHED_OTHER nice %d for %d: %w", nice, pid, err)
	}
	return nil
}

// SetNice sets the nice value of pid (process-wide for its main thread).
func SetNice(pid, nice int) error {
	if err := unix.Setpriority(unix.PRIO_PROCESS, pid, nice); err != nil {
		return fmt.Errorf("nice %d for %d: %w", nice, pid, err)
	}
	return nil
}

// OS applies scheduling through the kernel; it is the production
// implementation of the scheduler guardian's protector uses.
type OS struct{}

// Get implements the scheduler interface with Get.
func (OS) Get(pid int) (Attr, error) { return Get(pid) }

// SetRR implements the scheduler interface with SetRR.
func (OS) SetRR(pid, prio int) error { return SetRR(pid, prio) }

// SetOther implements the scheduler interface with SetOther.
func (OS) SetOther(pid, nice int) error { return SetOther(pid, nice) }

// SetNice implements the scheduler interface with SetNice.
func (OS) SetNice(pid, nice int) error { return SetNice(pid, nice) }

// SetIdleProcess puts every thread of pid under SCHED_IDLE: it runs only
// when no other task of its CPU wants to. Every thread, since a policy is
// per thread and a busy process spins on any of them (a Go program on
// whichever its scheduler picked); the threads it starts later inherit the
// policy. An unprivileged process cannot leave SCHED_IDLE (RLIMIT_NICE 0).
func SetIdleProcess(pid int) error {
	return eachThread(pid, unix.SchedAttr{Size: uint32(unsafe.Sizeof(unix.SchedAttr{})), Policy: unix.SCHED_IDLE})
}

// SetNormalProcess puts every thread of pid back under SCHED_OTHER at
// nice 0, as an unprivileged process starts.
func SetNormalProcess(pid int) error {
	return eachThread(pid, unix.SchedAttr{Size: uint32(unsafe.Sizeof(unix.SchedAttr{})), Policy: unix.SCHED_NORMAL})
}

// eachThread applies attr to every thread of pid. A thread that a
// not-yet-changed thread starts while the walk runs inherits the old policy
// and is missing from the listing taken before it, so the walk repeats until
// a listing holds no thread it has not set (threads started by changed ones
// inherit attr). A process that starts threads faster than the walk ends is
// bounded by maxThreadPasses.
func eachThread(pid int, attr unix.SchedAttr) error {
	set := map[int]bool{}
	var first error
	for pass := 0; pass < maxThreadPasses; pass++ {
		tids, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			if pass > 0 && errors.Is(err, fs.ErrNotExist) {
				return first // the process ended during the walk
			}
			return fmt.Errorf("threads of %d: %w", pid, err)
		}
		fresh := 0
		for _, d := range tids {
			tid, err := strconv.Atoi(d.Name())
			if err != nil || set[tid] {
				continue
			}
			set[tid] = true
			fresh++
			a := attr
			if err := unix.SchedSetAttr(tid, &a, 0); err != nil && first == nil && !errors.Is(err, unix.ESRCH) {
				first = fmt.Errorf("policy %d for thread %d of %d: %w", attr.Policy, tid, pid, err)
			}
		}
		if fresh == 0 {
			return first
		}
	}
	return first
}

// maxThreadPasses bounds eachThread's walks over a process's threads.
const maxThreadPasses = 16

// SetIdleProcess implements the scheduler interface with SetIdleProcess.
func (OS) SetIdleProcess(pid int) error { return SetIdleProcess(pid) }

// SetNormalProcess implements the scheduler interface with SetNormalProcess.
func (OS) SetNormalProcess(pid int) error { return SetNormalProcess(pid) }
