package victim

import (
	"sort"
	"time"
)

// MemoryLevel is how close the workspace is to its memory limit.
type MemoryLevel int

// Memory levels, in increasing severity.
const (
	MemoryOK    MemoryLevel = iota
	MemoryAlert             // at or above the alert fraction: tell the platform
	MemoryKill              // at or above the kill fraction: kill the largest unprotected process
)

// String names the level for logs.
func (l MemoryLevel) String() string {
	switch l {
	case MemoryAlert:
		return "alert"
	case MemoryKill:
		return "kill"
	default:
		return "ok"
	}
}

// MemoryPolicy turns usage against the limit M into a level.
type MemoryPolicy struct {
	AlertFraction float64 // of M; default 0.95
	KillFraction  float64 // of M; default 0.98 minus a safety margin chosen by the caller
	// HeldStall (0 to 1) is the share of the last 10 s in which the
	// workspace's tasks stalled on memory (PSI "some") that, with usage
	// over memory.high while the kernel throttles, means the workspace is
	// held there (HeldAtHigh); 0 turns that reading off.
	HeldStall float64
}

// HeldAtHigh reports whether the kernel holds the workspace at memory.high
// (cgroup v2), which sits below the alert and kill levels: there the
// kernel throttles every allocation in the workspace, a login's and a
// shell's too, and a hog throttled there may never reach those levels.
// throttled says the kernel throttled allocations since the last look
// (memory.events "high" rose). Held: throttled, and usage at the alert
// level (far above memory.high: reclaim is losing), or usage still over
// memory.high with the workspace stalled on memory at least HeldStall of
// the time (stall). Only throttling, or only stalls below memory.high,
// is not held: reclaim that keeps up, as page cache being dropped, costs
// the workspace little.
func (m MemoryPolicy) HeldAtHigh(usage, high, limit uint64, throttled bool, stall float64) bool {
	switch {
	case !throttled:
		return false
	case m.Level(usage, limit) >= MemoryAlert:
		return true
	default:
		return m.HeldStall > 0 && high > 0 && usage >= high && stall >= m.HeldStall
	}
}

// Level classifies usage against the limit. A zero limit (unknown) is never
// an emergency.
func (m MemoryPolicy) Level(usage, limit uint64) MemoryLevel {
	if limit == 0 {
		return MemoryOK
	}
	switch f := float64(usage) / float64(limit); {
	case f >= m.KillFraction:
		return MemoryKill
	case f >= m.AlertFraction:
		return MemoryAlert
	default:
		return MemoryOK
	}
}

// Unfreeable reports whether memory held outside processes (tmpfs, shm:
// shmem in memory.stat) alone keeps usage at or above the alert threshold,
// so that killing processes cannot bring it down. guardian then alerts
// instead of killing in a loop.
func (m MemoryPolicy) Unfreeable(usage, shmem, limit uint64) bool {
	if limit == 0 {
		return false
	}
	target := uint64(m.AlertFraction * float64(limit))
	return usage >= target && shmem >= target
}

// KillBudget stops a kill-restart loop: after Max kills within Window,
// killing pauses for Pause. Its fields are exported so guardian can persist
// them and take them up again after a restart.
type KillBudget struct {
	Max         int           `json:"-"`
	Window      time.Duration `json:"-"`
	Pause       time.Duration `json:"-"`
	Kills       []time.Time   `json:"kills"`
	PausedUntil time.Time     `json:"paused_until"`
}

// Allow reports whether a kill may happen now.
func (b *KillBudget) Allow(now time.Time) bool {
	return !now.Before(b.PausedUntil)
}

// Record notes a kill at now and reports whether it started a pause.
func (b *KillBudget) Record(now time.Time) (paused bool) {
	kept := b.Kills[:0]
	for _, k := range b.Kills {
		if now.Sub(k) < b.Window {
			kept = append(kept, k)
		}
	}
	b.Kills = append(kept, now)
	if b.Max > 0 && len(b.Kills) >= b.Max {
		b.PausedUntil = now.Add(b.Pause)
		b.Kills = nil
		return true
	}
	return false
}

// CPUFraction is the share of the cgroup's CPU capacity (cpus: the CFS quota
// in CPUs, or the number of online CPUs without a quota) used over elapsed.
func CPUFraction(used, elapsed time.Duration, cpus float64) float64 {
	if elapsed <= 0 || cpus <= 0 {
		return 0
	}
	return used.Seconds() / (elapsed.Seconds() * cpus)
}

// HangPolicy is the escalation for a hung workspace: only CPU above
// CPUFraction while SSH is unreachable counts; high CPU alone never kills,
// it may be a training job.
type HangPolicy struct {
	CPUFraction float64       // default 0.95
	AlertAfter  time.Duration // default 30s
	KillOne     time.Duration // default 90s: kill the top-CPU unprotected process
	KillThree   time.Duration // default 180s: kill the top 3
	KillAll     time.Duration // default 300s: kill every unprotected process
	// Recovery is how long the hang condition must stay absent, without
	// interruption, to end a hang (default 10s): every observation in that
	// span has CPU at or below CPUFraction or SSH reachable. One such
	// observation alone ends nothing: a CPU sample that dips under a CFS
	// quota, or an SSH banner that squeezes through a saturated CPU once,
	// says nothing about whether the workspace is usable again, and
	// restarting the escalation on it would postpone the kills without end.
	// A hang observed again before Recovery has passed continues the
	// escalation where it stood, its duration counted from its start.
	Recovery time.Duration
}

// HangAction is what the hang tracker asks for. Kill is the number of
// top-CPU unprotected processes to kill, -1 for all of them, 0 for none.
type HangAction struct {
	Alert bool
	Kill  int
	Hung  time.Duration // how long the workspace has been hung
}

// HangTracker follows one hang from its start. It is persisted so that a
// restarted guardian continues the escalation instead of starting over.
type HangTracker struct {
	Policy HangPolicy `json:"-"`
	Since  time.Time  `json:"since"` // zero while not hung
	Stage  int        `json:"stage"` // escalation steps already taken
	Acted  time.Time  `json:"acted"` // when the last step was taken
	// Calm is when the hang condition was first seen absent again during
	// a hang, zero while it holds: the start of the recovery span.
	Calm time.Time `json:"calm"`
}

// Observe feeds one CPU measurement and the SSH probe result and returns
// the action due now. The workspace is hung while cpu is above
// CPUFraction and SSH is unreachable; sshOK is consulted only then, so a
// caller need not probe while CPU is low. Each step happens once per hang;
// once every step was taken the last one (kill all) repeats every
// AlertAfter while the hang lasts. A hang ends only after Recovery without
// the condition (see HangPolicy.Recovery); no step is taken meanwhile.
func (h *HangTracker) Observe(now time.Time, cpu float64, sshOK bool) HangAction {
	if cpu <= h.Policy.CPUFraction || sshOK {
		if h.Since.IsZero() {
			return HangAction{}
		}
		if h.Calm.IsZero() {
			h.Calm = now
		}
		if now.Sub(h.Calm) >= h.Policy.Recovery {
			h.Since, h.Stage, h.Acted, h.Calm = time.Time{}, 0, time.Time{}, time.Time{}
			return HangAction{}
		}
		return HangAction{Hung: now.Sub(h.Since)}
	}
	h.Calm = time.Time{}
	if h.Since.IsZero() {
		h.Since = now
	}
	hung := now.Sub(h.Since)
	steps := []struct {
		after time.Duration
		act   HangAction
	}{
		{h.Policy.AlertAfter, HangAction{Alert: true}},
		{h.Policy.KillOne, HangAction{Alert: true, Kill: 1}},
		{h.Policy.KillThree, HangAction{Alert: true, Kill: 3}},
		{h.Policy.KillAll, HangAction{Alert: true, Kill: -1}},
	}
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].after < steps[j].after })
	due := 0
	for i, s := range steps {
		if hung >= s.after {
			due = i + 1
		}
	}
	if due > h.Stage {
		h.Stage, h.Acted = due, now
		a := steps[due-1].act
		a.Hung = hung
		return a
	}
	if h.Stage == len(steps) && now.Sub(h.Acted) >= h.Policy.AlertAfter {
		h.Acted = now
		a := steps[len(steps)-1].act
		a.Hung = hung
		return a
	}
	return HangAction{Hung: hung}
}
