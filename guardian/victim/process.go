package victim

import (
	"errors"
	"fmt"
	"sort"
)

// ErrGone says a process no longer exists (or is exiting). Reading it
// (package procfs) and signalling it (package killer) report it with this
// one error, so a caller can tell "gone" from "refused" whichever it used.
var ErrGone = errors.New("process gone")

// Identity names one process for its whole life. A PID alone is reused by the
// kernel and a name is chosen by the user, so guardian acts on a process only
// when PID, start time, executable and cgroup all still match.
type Identity struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // clock ticks after boot (field 22 of /proc/PID/stat)
	Exe       string `json:"exe"`        // resolved /proc/PID/exe; empty for kernel threads or when unreadable
	Cgroup    string `json:"cgroup"`     // the cgroup path the process was found in
}

// String renders the identity for logs and alerts.
func (id Identity) String() string {
	return fmt.Sprintf("pid=%d start=%d exe=%s", id.PID, id.StartTime, id.Exe)
}

// Key is the part of an identity that distinguishes two processes ever
// created on one boot: the kernel never starts two processes with the same
// PID in the same clock tick.
type Key struct {
	PID       int
	StartTime uint64
}

// Key returns the (PID, start time) pair of the identity.
func (id Identity) Key() Key { return Key{PID: id.PID, StartTime: id.StartTime} }

// Process is one row of the process table as guardian sees it.
type Process struct {
	Identity
	PPID     int    `json:"ppid"`
	State    string `json:"state"`     // kernel state letter: R, S, D, T (stopped), ...
	Comm     string `json:"comm"`      // the user-controlled name; never used to grant protection
	RSS      uint64 `json:"rss_bytes"` // resident set size in bytes
	CPUTicks uint64 `json:"cpu_ticks"` // utime+stime in clock ticks (TicksPerSecond)
}

// ByKey indexes a process snapshot by (PID, start time).
func ByKey(procs []Process) map[Key]Process {
	m := make(map[Key]Process, len(procs))
	for _, p := range procs {
		m[p.Key()] = p
	}
	return m
}

// LargestRSS returns the unprotected process with the largest resident set,
// the memory victim. ok is false when every process is protected. Ties are
// broken towards the younger process, which usually is the one that grew.
func LargestRSS(procs []Process, protected Protected) (victim Process, ok bool) {
	for _, p := range procs {
		if protected.Has(p.Identity) {
			continue
		}
		if !ok || p.RSS > victim.RSS || (p.RSS == victim.RSS && p.StartTime > victim.StartTime) {
			victim, ok = p, true
		}
	}
	return victim, ok
}

// TopCPU returns up to n unprotected processes that consumed the most CPU
// between the two snapshots, busiest first. A process absent from prev is
// charged with all its ticks (it was born in between). n <= 0 means all
// unprotected processes, ordered by CPU use.
func TopCPU(prev, cur []Process, protected Protected, n int) []Process {
	before := ByKey(prev)
	type used struct {
		p     Process
		ticks uint64
	}
	var cand []used
	for _, p := range cur {
		if protected.Has(p.Identity) {
			continue
		}
		d := p.CPUTicks
		if b, seen := before[p.Key()]; seen && b.CPUTicks <= p.CPUTicks {
			d = p.CPUTicks - b.CPUTicks
		}
		cand = append(cand, used{p, d})
	}
	sort.SliceStable(cand, func(i, j int) bool {
		if cand[i].ticks != cand[j].ticks {
			return cand[i].ticks > cand[j].ticks
		}
		return cand[i].p.PID < cand[j].p.PID
	})
	if n > 0 && len(cand) > n {
		cand = cand[:n]
	}
	out := make([]Process, len(cand))
	for i, c := range cand {
		out[i] = c.p
	}
	return out
}

// Unprotected returns the processes not in the protected set, the targets of
// a cleanup or of fork-bomb containment.
func Unprotected(procs []Process, protected Protected) []Process {
	var out []Process
	for _, p := range procs {
		if !protected.Has(p.Identity) {
			out = append(out, p)
		}
	}
	return out
}
