package guard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"labkeep/guardian/alert"
	"labkeep/guardian/cgroupfs"
	"labkeep/guardian/killer"
	"labkeep/guardian/victim"
)

// memoryLoop reacts to the kernel's memory notifications, with polling as
// the fallback.
func (g *Guardian) memoryLoop(ctx context.Context) {
	m := g.memLimit()
	policy := g.memPolicy()
	thresholds := []uint64{uint64(policy.AlertFraction * float64(m)), uint64(policy.KillFraction * float64(m))}
	events, err := g.cg.WatchMemory(ctx, thresholds)
	if err != nil {
		g.log.Warn("memory notifications unavailable, polling only", "every", g.cfg.MemoryPoll, "err", err)
	}
	t := time.NewTicker(g.cfg.MemoryPoll)
	defer t.Stop()
	for {
		// After a kill, look again at once: a hog of several processes
		// still grows.
		for i := 0; i < 10 && g.checkMemory(ctx); i++ {
		}
		g.beat("memory")
		select {
		case <-ctx.Done():
			return
		case _, ok := <-events:
			if !ok {
				events = nil
			}
		case <-t.C:
		}
	}
}

func (g *Guardian) memLimit() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.st.MemoryLimit
}

func (g *Guardian) memPolicy() victim.MemoryPolicy {
	return victim.MemoryPolicy{AlertFraction: g.cfg.AlertFraction, KillFraction: g.cfg.KillFraction, HeldStall: g.cfg.HeldStall}
}

// memHigh is memory.high for the limit m (v2; v1's soft limit).
func (g *Guardian) memHigh(m uint64) uint64 { return uint64(g.cfg.HighFraction * float64(m)) }

// checkMemory evaluates the memory state once and, when due, kills the
// largest unprotected process. It reports whether it killed. The steps:
// read the counters (reporting kernel OOM kills), decide from the level
// whether a kill is due (alerting on the way), then act.
func (g *Guardian) checkMemory(ctx context.Context) bool {
	r, ok := g.readMemory()
	if !ok {
		return false
	}
	if !g.killDue(r) {
		return false
	}
	return g.killLargest(ctx, r)
}

// memReading is one look at the workspace's memory.
type memReading struct {
	at           time.Time
	usage, shmem uint64
	limit        uint64 // M
	ev           cgroupfs.MemoryEvents
	level        victim.MemoryLevel
	pct          string  // usage as a percentage of M, for messages
	high         uint64  // memory.high (v2)
	stall        float64 // v2: share of the last 10 s stalled on memory, read while throttled
	// throttled: v2 only. The kernel holds the workspace at memory.high
	// (victim.MemoryPolicy.HeldAtHigh): it throttles allocations there
	// and reclaim is losing, and the workspace (its sshd included)
	// crawls. memory.high sits below the kill level, so a hog held there
	// would never reach it: this counts as being held at the limit.
	throttled bool
}

// held reports whether the workspace is being held at its limit: tasks
// waiting under OOM (v1) or allocations throttled at memory.high (v2).
// Waiting is not an option then: a kill is due even below the kill level
// or during a kill-loop pause, and it is a SIGKILL at once.
func (r memReading) held() bool { return r.ev.UnderOOM || r.throttled }

// readMemory reads usage and the event counters, updates the usage metric
// and reports kernel OOM kills since the last look. A failed event read
// leaves the counters at zero (no OOM seen) rather than skipping the check.
func (g *Guardian) readMemory() (memReading, bool) {
	r := memReading{limit: g.memLimit()}
	var err error
	r.usage, r.shmem, err = g.cg.MemoryUsage()
	if err != nil {
		g.log.Error("read memory usage", "err", err)
		return r, false
	}
	if r.ev, err = g.cg.MemoryEvents(); err != nil {
		g.log.Error("read memory events", "err", err)
	}
	g.metrics.memoryUsage.Set(float64(r.usage))
	r.at = g.now()
	g.mu.Lock()
	newOOMKills := r.ev.OOMKill - min(r.ev.OOMKill, g.st.LastOOMKill)
	g.st.LastOOMKill = r.ev.OOMKill
	highRose := g.highSeen && r.ev.High > g.lastHigh
	g.lastHigh, g.highSeen = r.ev.High, true
	g.mu.Unlock()
	if newOOMKills > 0 {
		g.raise("kernel-oom-kill", "", alert.Critical, fmt.Sprintf("the kernel OOM killer killed %d process(es) in the workspace", newOOMKills), nil)
	}
	policy := g.memPolicy()
	r.level = policy.Level(r.usage, r.limit)
	if g.cg.Version() == 2 {
		r.high = g.memHigh(r.limit)
	}
	// memory.pressure is read only where HeldAtHigh would look at it.
	if highRose && r.high > 0 && r.usage >= r.high {
		if r.stall, err = g.cg.MemoryStall(); err != nil {
			g.log.Debug("read memory stall", "err", err)
		}
	}
	r.throttled = policy.HeldAtHigh(r.usage, r.high, r.limit, highRose, r.stall)
	r.pct = fmt.Sprintf("%.1f%%", 100*float64(r.usage)/float64(r.limit))
	return r, true
}

// killDue decides from one reading whether a process must be killed now.
// Below the alert level it forgets when the kill threshold was crossed;
// from the alert level on it alerts; at the kill level (or held at the
// limit, see memReading.held) a kill is due unless the memory is held by
// tmpfs/shm, which no kill frees, or repeated kills paused threshold kills.
func (g *Guardian) killDue(r memReading) bool {
	if r.level == victim.MemoryOK && !r.held() {
		g.mu.Lock()
		g.crossedAt = time.Time{}
		g.mu.Unlock()
		return false
	}
	g.raise("memory-high", "", alert.Warning, fmt.Sprintf("workspace memory at %s of its limit", r.pct),
		map[string]string{"usage": strconv.FormatUint(r.usage, 10), "limit": strconv.FormatUint(r.limit, 10)})
	if r.level < victim.MemoryKill && !r.held() {
		return false
	}
	g.mu.Lock()
	if g.crossedAt.IsZero() {
		g.crossedAt = r.at
	}
	allowed := g.st.Budget.Allow(r.at)
	pausedUntil := g.st.Budget.PausedUntil
	g.mu.Unlock()
	// Held at memory.high by tmpfs alone is no better: no kill takes
	// usage below it.
	if g.memPolicy().Unfreeable(r.usage, r.shmem, r.limit) || (r.throttled && r.shmem >= r.high) {
		g.raise("memory-unfreeable", "", alert.Critical,
			fmt.Sprintf("workspace memory at %s is held by tmpfs/shm (%d bytes); killing processes cannot free it, nothing killed", r.pct, r.shmem), nil)
		return false
	}
	// Held at the limit, not killing would hang the workspace, so the
	// kill-loop pause yields; it only holds back kills at the threshold.
	if !allowed && !r.held() {
		g.raise("memory-kill-paused", "", alert.Warning,
			fmt.Sprintf("memory at %s but kills are paused until %s after repeated kills", r.pct, pausedUntil.Format(time.RFC3339)), nil)
		return false
	}
	return true
}

// killLargest stops the growth, picks the largest-RSS unprotected process
// and terminates it (SIGTERM, SIGKILL after the grace period; SIGKILL at
// once with tasks waiting at the hard limit), then records the kill.
func (g *Guardian) killLargest(ctx context.Context, r memReading) bool {
	g.emergency.Lock()
	defer g.emergency.Unlock()
	frozen := g.freezeForKill(ctx, r.ev.UnderOOM)
	froze := frozen
	thaw := func() {
		if frozen {
			if err := g.cg.Thaw(); err != nil {
				g.log.Error("thaw after memory kill", "err", err)
			}
			frozen = false
		}
	}
	defer thaw()
	procs, prot, err := g.snapshot()
	if err != nil {
		g.log.Error("memory: snapshot", "err", err)
		return false
	}
	v, ok := victim.LargestRSS(procs, prot)
	if !ok {
		g.raise("memory-no-victim", "", alert.Critical, fmt.Sprintf("memory at %s and only protected processes are left", r.pct), nil)
		return false
	}
	grace := g.cfg.KillGrace
	if r.held() {
		grace = 0
	}
	// The kill hurries to SIGKILL once the hard limit is reached meanwhile.
	hurry := func() bool {
		e, err := g.cg.MemoryEvents()
		return err == nil && (e.UnderOOM || e.OOM > r.ev.OOM || e.Max > r.ev.Max)
	}
	g.letDie(v.Identity)
	// The identity check and the first signal happen while frozen; the
	// thaw right after lets the signal take effect.
	hard, err := g.killer.Terminate(ctx, v.Identity, killer.Plan{Grace: grace, KillWait: g.cfg.KillWait, Hurry: hurry, AfterFirstSignal: thaw})
	if err != nil && !errors.Is(err, errGone) {
		g.log.Warn("memory victim not killed", "pid", v.PID, "exe", v.Exe, "err", err)
		return false
	}
	g.recordMemoryKill(r, v, hard, froze)
	return true
}

// freezeForKill stops the growth first: a fast hog passes from the kill
// threshold to the hard limit in milliseconds, and at the hard limit the
// kernel fails other processes' allocations (a login's fork). Frozen,
// nothing grows while the victim is chosen and signalled. Tasks already
// waiting at the limit (v1) may not freeze, so then it does not try; a
// freeze that does not complete quickly is undone. It reports whether the
// cgroup is frozen.
func (g *Guardian) freezeForKill(ctx context.Context, underOOM bool) bool {
	if underOOM {
		return false
	}
	fctx, cancel := context.WithTimeout(ctx, min(g.cfg.FreezeTimeout, 100*time.Millisecond))
	defer cancel()
	if g.cg.Freeze(fctx) == nil {
		return true
	}
	_ = g.cg.Thaw()
	return false
}

// recordMemoryKill updates metrics, kill budget and state after a memory
// kill and raises its alerts (and the kill-loop alert when it started a
// pause).
func (g *Guardian) recordMemoryKill(r memReading, v victim.Process, hard, froze bool) {
	dead := g.now()
	g.mu.Lock()
	reaction := dead.Sub(g.crossedAt)
	paused := g.st.Budget.Record(dead)
	g.st.Kills++
	g.crossedAt = time.Time{}
	g.mu.Unlock()
	g.metrics.kills.WithLabelValues("memory").Inc()
	g.metrics.memoryReaction.Set(reaction.Seconds())
	g.log.Info("memory victim killed", "pid", v.PID, "exe", v.Exe, "comm", v.Comm, "rss", v.RSS, "usage", r.usage,
		"limit", r.limit, "sigkill", hard, "under_oom", r.ev.UnderOOM, "throttled", r.throttled, "stall", r.stall, "frozen_first", froze, "reaction_ms", reaction.Milliseconds())
	g.raise("memory-kill", strconv.Itoa(v.PID), alert.Critical,
		fmt.Sprintf("memory at %s: killed pid %d (%s, %s, RSS %d MiB)", r.pct, v.PID, v.Comm, v.Exe, v.RSS>>20),
		map[string]string{"pid": strconv.Itoa(v.PID), "exe": v.Exe, "rss": strconv.FormatUint(v.RSS, 10), "reaction_ms": strconv.FormatInt(reaction.Milliseconds(), 10)})
	if paused {
		g.raise("memory-kill-loop", "", alert.Critical,
			fmt.Sprintf("%d memory kills within %v: pausing threshold kills for %v", g.cfg.KillMax, g.cfg.KillWindow, g.cfg.KillPause), nil)
	}
	g.saveLogged()
}
