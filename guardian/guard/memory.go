package guard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"labkeep/guardian/alert"
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
	return victim.MemoryPolicy{AlertFraction: g.cfg.AlertFraction, KillFraction: g.cfg.KillFraction}
}

// checkMemory evaluates the memory state once and kills the largest
// unprotected process when due. It reports whether it killed.
func (g *Guardian) checkMemory(ctx context.Context) bool {
	m := g.memLimit()
	usage, shmem, err := g.cg.MemoryUsage()
	if err != nil {
		g.log.Error("read memory usage", "err", err)
		return false
	}
	ev, err := g.cg.MemoryEvents()
	if err != nil {
		g.log.Error("read memory events", "err", err)
	}
	g.metrics.memoryUsage.Set(float64(usage))
	now := g.now()
	g.mu.Lock()
	newOOMKills := ev.OOMKill - min(ev.OOMKill, g.st.LastOOMKill)
	g.st.LastOOMKill = ev.OOMKill
	g.mu.Unlock()
	if newOOMKills > 0 {
		g.raise("kernel-oom-kill", "", alert.Critical, fmt.Sprintf("the kernel OOM killer killed %d process(es) in the workspace", newOOMKills), nil)
	}
	policy := g.memPolicy()
	level := policy.Level(usage, m)
	pct := fmt.Sprintf("%.1f%%", 100*float64(usage)/float64(m))
	if level == victim.MemoryOK && !ev.UnderOOM {
		g.mu.Lock()
		g.crossedAt = time.Time{}
		g.mu.Unlock()
		return false
	}
	g.raise("memory-high", "", alert.Warning, fmt.Sprintf("workspace memory at %s of its limit", pct),
		map[string]string{"usage": strconv.FormatUint(usage, 10), "limit": strconv.FormatUint(m, 10)})
	if level < victim.MemoryKill && !ev.UnderOOM {
		return false
	}
	g.mu.Lock()
	if g.crossedAt.IsZero() {
		g.crossedAt = now
	}
	crossed := g.crossedAt
	allowed := g.st.Budget.Allow(now)
	pausedUntil := g.st.Budget.PausedUntil
	g.mu.Unlock()
	if policy.Unfreeable(usage, shmem, m) {
		g.raise("memory-unfreeable", "", alert.Critical,
			fmt.Sprintf("workspace memory at %s is held by tmpfs/shm (%d bytes); killing processes cannot free it, nothing killed", pct, shmem), nil)
		return false
	}
	// At the hard limit (tasks waiting, v1) not killing would hang the
	// workspace, so the kill-loop pause yields; it only holds back kills at
	// the threshold.
	if !allowed && !ev.UnderOOM {
		g.raise("memory-kill-paused", "", alert.Warning,
			fmt.Sprintf("memory at %s but kills are paused until %s after repeated kills", pct, pausedUntil.Format(time.RFC3339)), nil)
		return false
	}
	g.emergency.Lock()
	defer g.emergency.Unlock()
	// Stop the growth first: a fast hog passes from the kill threshold to
	// the hard limit in milliseconds, and at the hard limit the kernel fails
	// other processes' allocations (a login's fork). Frozen, nothing grows
	// while the victim is chosen and signalled. Tasks already waiting at the
	// limit (v1) may not freeze, so then the freeze is skipped.
	frozen, froze := false, false
	if !ev.UnderOOM {
		fctx, cancel := context.WithTimeout(ctx, min(g.cfg.FreezeTimeout, 100*time.Millisecond))
		frozen = g.cg.Freeze(fctx) == nil
		cancel()
		froze = frozen
		if !frozen {
			_ = g.cg.Thaw()
		}
	}
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
		g.raise("memory-no-victim", "", alert.Critical, fmt.Sprintf("memory at %s and only protected processes are left", pct), nil)
		return false
	}
	grace := g.cfg.KillGrace
	if ev.UnderOOM {
		grace = 0
	}
	hurry := func() bool {
		e, err := g.cg.MemoryEvents()
		return err == nil && (e.UnderOOM || e.OOM > ev.OOM || e.Max > ev.Max)
	}
	// The identity check and the first signal happen while frozen; the
	// thaw right after lets the signal take effect.
	hard, err := g.killer.Terminate(ctx, v.Identity, killer.Plan{Grace: grace, KillWait: g.cfg.KillWait, Hurry: hurry, AfterFirstSignal: thaw})
	if err != nil && !errors.Is(err, errGone) {
		g.log.Warn("memory victim not killed", "pid", v.PID, "exe", v.Exe, "err", err)
		return false
	}
	dead := g.now()
	reaction := dead.Sub(crossed)
	g.metrics.kills.WithLabelValues("memory").Inc()
	g.metrics.memoryReaction.Set(reaction.Seconds())
	g.mu.Lock()
	paused := g.st.Budget.Record(dead)
	g.st.Kills++
	g.crossedAt = time.Time{}
	g.mu.Unlock()
	g.log.Info("memory victim killed", "pid", v.PID, "exe", v.Exe, "comm", v.Comm, "rss", v.RSS, "usage", usage,
		"limit", m, "sigkill", hard, "under_oom", ev.UnderOOM, "frozen_first", froze, "reaction_ms", reaction.Milliseconds())
	g.raise("memory-kill", strconv.Itoa(v.PID), alert.Critical,
		fmt.Sprintf("memory at %s: killed pid %d (%s, %s, RSS %d MiB)", pct, v.PID, v.Comm, v.Exe, v.RSS>>20),
		map[string]string{"pid": strconv.Itoa(v.PID), "exe": v.Exe, "rss": strconv.FormatUint(v.RSS, 10), "reaction_ms": strconv.FormatInt(reaction.Milliseconds(), 10)})
	if paused {
		g.raise("memory-kill-loop", "", alert.Critical,
			fmt.Sprintf("%d memory kills within %v: pausing threshold kills for %v", g.cfg.KillMax, g.cfg.KillWindow, g.cfg.KillPause), nil)
	}
	g.saveLogged()
	return true
}
