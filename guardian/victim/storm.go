package victim

import "time"

// StormPolicy decides who gives way while the workspace's CPU is
// saturated. Under a CFS quota every task of the workspace, a login's
// included, shares the quota with whatever spins: with 64 spinners a login
// gets one 65th of it and waits for throttled periods. Demoting the busy
// processes to SCHED_IDLE gives any ordinary task (a login's shell, sshd's
// connection processes) the CPU as soon as it wants it, while the busy
// processes still get every cycle nobody else wants, so a long job loses
// next to nothing. Nothing is killed: high CPU alone is no emergency.
type StormPolicy struct {
	// CPUFraction: the workspace is saturated while it uses at least this
	// share of its CPU capacity (the quota) over an observation.
	CPUFraction float64
	// Runnable: the workspace is saturated too while at least Runnable
	// times its capacity in unprotected processes are runnable at once, at
	// both ends of an observation (a burst of processes starting up is
	// runnable for an instant and is no storm).
	// On a busy host the workspace may not even get its quota, yet a
	// login waits behind every spinner all the same.
	Runnable float64
	// MinShare: during saturation, an unprotected process that used at
	// least this share of one CPU over the observation is demoted.
	MinShare float64
	// Calm is how long saturation must stay absent before the demoted
	// processes get normal scheduling back: a demoted spinner leaves CPU
	// to others, and one quiet sample under a quota says nothing.
	Calm time.Duration
}

// StormAction is what the tracker asks for after one observation.
type StormAction struct {
	Saturated bool
	// Demote lists every process demoted during this storm that is still
	// alive, newly found consumers included: demotion is re-applied each
	// time (the caller skips those already idle).
	Demote []Process
	// Restore lists the demoted processes to give normal scheduling back,
	// once the storm is over.
	Restore []Process
}

// StormTracker follows one CPU storm; its zero value (with a Policy) is
// calm.
type StormTracker struct {
	Policy  StormPolicy
	demoted map[Key]bool
	calm    time.Time // when saturation was first seen absent during a storm
}

// ticksPerSecond is USER_HZ, the unit of Process.CPUTicks.
const ticksPerSecond = 100

// Observe feeds the workspace's CPU share over the last elapsed (cpu, as
// CPUFraction computes it), its capacity in CPUs, and the process
// snapshots at the start (prev) and end (cur) of elapsed, and says who to
// demote or restore. Protected processes are never demoted.
func (t *StormTracker) Observe(now time.Time, cpu, cpus float64, elapsed time.Duration, prev, cur []Process, protected Protected) StormAction {
	if t.demoted == nil {
		t.demoted = map[Key]bool{}
	}
	alive := make(map[Key]bool, len(cur))
	for _, p := range cur {
		alive[p.Key()] = true
	}
	crowded := func(procs []Process) bool {
		runnable := 0
		for _, p := range procs {
			if p.State == "R" && !protected.Has(p.Identity) {
				runnable++
			}
		}
		return t.Policy.Runnable > 0 && float64(runnable) >= t.Policy.Runnable*cpus
	}
	act := StormAction{Saturated: cpu >= t.Policy.CPUFraction || (crowded(prev) && crowded(cur))}
	for k := range t.demoted {
		if !alive[k] {
			delete(t.demoted, k)
		}
	}
	if act.Saturated {
		t.calm = time.Time{}
		floor := t.Policy.MinShare * elapsed.Seconds() * ticksPerSecond
		before := ByKey(prev)
		for _, p := range cur {
			if protected.Has(p.Identity) {
				continue
			}
			used := p.CPUTicks
			if b, seen := before[p.Key()]; seen && b.CPUTicks <= p.CPUTicks {
				used -= b.CPUTicks
			}
			if used > 0 && float64(used) >= floor {
				t.demoted[p.Key()] = true
			}
		}
	} else if len(t.demoted) > 0 {
		if t.calm.IsZero() {
			t.calm = now
		}
		if now.Sub(t.calm) >= t.Policy.Calm {
			for _, p := range cur {
				if t.demoted[p.Key()] {
					act.Restore = append(act.Restore, p)
				}
			}
			t.demoted, t.calm = map[Key]bool{}, time.Time{}
			return act
		}
	}
	for _, p := range cur {
		if t.demoted[p.Key()] && !protected.Has(p.Identity) {
			act.Demote = append(act.Demote, p)
		}
	}
	return act
}

// Demoted is how many live processes the current storm has demoted.
func (t *StormTracker) Demoted() int { return len(t.demoted) }
