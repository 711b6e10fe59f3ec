package guard

import (
	"context"
	"errors"
	"fmt"
	"os"

	"labkeep/guardian/alert"
)

// Start loads saved state, applies the kernel settings (limits first: they
// stay when guardian is killed) and protects processes once. An error here
// means guardian cannot protect the workspace and should exit non-zero.
func (g *Guardian) Start(ctx context.Context) error {
	if err := g.load(); err != nil {
		return err
	}
	g.mu.Lock()
	g.st.Starts++
	restarted := g.st.Starts > 1
	m := g.cfg.MemoryLimit
	if m == 0 {
		m = g.st.MemoryLimit
	}
	g.mu.Unlock()
	if m == 0 {
		cur, err := g.cg.MemoryLimit()
		if err != nil {
			return fmt.Errorf("read memory limit: %w", err)
		}
		if cur == 0 {
			return errors.New("the workspace cgroup has no memory limit and none is configured (GUARDIAN_MEMORY_LIMIT)")
		}
		m = cur
	}
	g.mu.Lock()
	g.st.MemoryLimit = m
	g.mu.Unlock()
	g.alerts.Restore(g.st.Alerts)

	if err := g.applyLimits(); err != nil {
		// Not fatal: a guardian that exits protects nothing. The protector
		// retries, and the memory loop can free memory meanwhile (setting a
		// limit below current usage fails with EBUSY).
		g.raise("limits-not-applied", "", alert.Critical, fmt.Sprintf("kernel limits not applied yet, retrying: %v", err), nil)
	}
	if g.cfg.HandleOOM {
		if err := g.cg.HandleOOM(); err != nil {
			g.raise("oom-handling-unavailable", "", alert.Warning, fmt.Sprintf("cannot take over OOM handling: %v", err), nil)
		}
	}
	if err := g.cg.GrantRT(g.cfg.RTRuntimeUS); err != nil {
		g.mu.Lock()
		g.rtRefused = true
		g.mu.Unlock()
		g.raise("sshd-rt-unavailable", "", alert.Warning,
			fmt.Sprintf("no real-time budget for the workspace cgroup (%v); sshd gets nice %d instead of SCHED_RR", err, g.cfg.FallbackNice), nil)
	}
	g.metrics.memoryLimit.Set(float64(m))
	g.log.Info("started", "cgroup", g.cg.String(), "memory_limit", m, "restarted", restarted, "starts", g.st.Starts)
	g.protect(ctx)
	return g.save()
}

// applyLimits sets memory.high/max and pids.max unless they already have
// the wanted values (a restarted guardian finds its own settings). It
// records whether they are in place, for the protector to retry.
func (g *Guardian) applyLimits() error {
	m := g.memLimit()
	high, max := uint64(g.cfg.HighFraction*float64(m)), uint64(g.cfg.MaxFraction*float64(m))
	var errs []error
	// The kernel rounds limits down to whole pages.
	if cur, err := g.cg.MemoryLimit(); err != nil || cur != max/pageSize*pageSize {
		if err := g.cg.SetMemory(high, max); err != nil {
			errs = append(errs, fmt.Errorf("memory limits: %w", err))
		}
	}
	if cur, err := g.cg.PidsLimit(); err != nil || cur != g.cfg.PidsMax {
		if err := g.cg.SetPidsMax(g.cfg.PidsMax); err != nil {
			errs = append(errs, fmt.Errorf("pids.max: %w", err))
		}
	}
	err := errors.Join(errs...)
	g.mu.Lock()
	g.limitsPending = err != nil
	g.mu.Unlock()
	if err == nil {
		g.log.Info("limits applied", "cgroup", g.cg.String(), "memory_limit", m, "memory_high", high, "memory_max", max, "pids_max", g.cfg.PidsMax)
	}
	return err
}

var pageSize = uint64(os.Getpagesize())
