package guard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"labkeep/guardian/alert"
	"labkeep/guardian/cgroupfs"
	"labkeep/guardian/victim"
)

// Start takes up the saved state (the limit M, kill history, hang
// escalation, alerts) and counts this start. It touches no cgroup: the
// workspace container may not exist yet.
func (g *Guardian) Start(ctx context.Context) error {
	if err := g.load(); err != nil {
		return err
	}
	g.mu.Lock()
	g.st.Starts++
	starts := g.st.Starts
	g.mu.Unlock()
	g.alerts.Restore(g.st.Alerts)
	g.log.Info("started", "restarted", starts > 1, "starts", starts)
	g.saveLogged() // a full state volume must not stop guardian from starting
	return nil
}

// ErrNoMemoryLimit is returned by Attach when M is neither configured,
// nor saved, nor readable from the cgroup: guardian cannot work without it.
var ErrNoMemoryLimit = errors.New("the workspace cgroup has no memory limit and none is configured (GUARDIAN_MEMORY_LIMIT)")

// Attach makes cg the guarded cgroup and applies the kernel settings
// (limits first: they stay when guardian is killed), then protects
// processes once. It first thaws cg: guardian is the only one to freeze
// the workspace, so a frozen cgroup means a guardian died between freeze
// and thaw, and sshd must not stay frozen. It fails with ErrNoMemoryLimit
// when M cannot be known, or when the cgroup cannot be read (it went
// away); settings the kernel refuses are alerted and retried.
func (g *Guardian) Attach(ctx context.Context, cg cgroupfs.Cgroup) error {
	g.emergency.Lock()
	g.mu.Lock()
	g.cg = cg
	g.listener, g.hadSSHD, g.rtRefused, g.limitsPending = victim.Identity{}, false, false, false
	g.sshd = sshdState{} // a new cgroup is a new container with a fresh root: its sshd is learnt again
	g.crossedAt = time.Time{}
	// The loops' heartbeats start afresh with this cgroup; the watch keeps
	// beating across, so liveness never lapses.
	g.heartbeats = map[string]time.Time{"watch": g.heartbeats["watch"]}
	g.mu.Unlock()
	g.emergency.Unlock()

	if err := cg.Thaw(); err != nil {
		g.log.Warn("thaw at attach", "cgroup", cg.String(), "err", err)
	}
	m, err := g.memoryLimitFor(cg)
	if err != nil {
		return err
	}
	if err := g.applyLimits(); err != nil {
		// Not fatal: a guardian that exits protects nothing. The protector
		// retries, and the memory loop can free memory meanwhile (setting a
		// limit below current usage fails with EBUSY).
		g.raise("limits-not-applied", "", alert.Critical, fmt.Sprintf("kernel limits not applied yet, retrying: %v", err), nil)
	}
	if g.cfg.HandleOOM {
		if err := cg.HandleOOM(); err != nil {
			g.raise("oom-handling-unavailable", "", alert.Warning, fmt.Sprintf("cannot take over OOM handling: %v", err), nil)
		}
	}
	if err := cg.GrantRT(g.cfg.RTRuntimeUS); err != nil {
		g.mu.Lock()
		g.rtRefused = true
		g.mu.Unlock()
		g.raise("sshd-rt-unavailable", "", alert.Warning,
			fmt.Sprintf("no real-time budget for the workspace cgroup (%v); sshd gets nice %d instead of SCHED_RR", err, g.cfg.FallbackNice), nil)
	}
	g.metrics.memoryLimit.Set(float64(m))
	g.log.Info("guarding", "cgroup", cg.String(), "memory_limit", m)
	g.protect(ctx)
	g.saveLogged() // a full state volume must not stop guardian from guarding
	return nil
}

// memoryLimitFor settles M: configured, else remembered from an earlier
// start (a restart must not take the lowered limit for M), else the
// cgroup's hard limit, which the kubelet set to the container's limit.
func (g *Guardian) memoryLimitFor(cg cgroupfs.Cgroup) (uint64, error) {
	g.mu.Lock()
	m := g.cfg.MemoryLimit
	if m == 0 {
		m = g.st.MemoryLimit
	}
	g.mu.Unlock()
	if m == 0 {
		cur, err := cg.MemoryLimit()
		if err != nil {
			return 0, fmt.Errorf("read memory limit: %w", err)
		}
		if cur == 0 {
			return 0, ErrNoMemoryLimit
		}
		m = cur
	}
	g.mu.Lock()
	g.st.MemoryLimit = m
	g.mu.Unlock()
	return m, nil
}

// detach forgets the guarded cgroup (its container is gone).
func (g *Guardian) detach() {
	g.emergency.Lock()
	defer g.emergency.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cg = nil
	g.sshd = sshdState{}
	g.highSeen = false // a new container's memory.events start at zero
}

// applyLimits sets memory.high/max and pids.max unless they already have
// the wanted values (a restarted guardian finds its own settings; the
// runtime may have written the container's own limits after guardian
// attached). It records whether they are in place, for the protector to
// retry and alert.
func (g *Guardian) applyLimits() error {
	m := g.memLimit()
	high, max := g.memHigh(m), uint64(g.cfg.MaxFraction*float64(m))
	var errs []error
	wrote := false
	// The kernel rounds limits down to whole pages.
	if cur, err := g.cg.MemoryLimit(); err != nil || cur != max/pageSize*pageSize {
		wrote = true
		if err := g.cg.SetMemory(high, max); err != nil {
			errs = append(errs, fmt.Errorf("memory limits: %w", err))
		}
	}
	if cur, err := g.cg.PidsLimit(); err != nil || cur != g.pidsMax() {
		wrote = true
		if err := g.cg.SetPidsMax(g.pidsMax()); err != nil {
			errs = append(errs, fmt.Errorf("pids.max: %w", err))
		}
	}
	err := errors.Join(errs...)
	g.mu.Lock()
	g.limitsPending = err != nil
	g.mu.Unlock()
	if err == nil && wrote {
		g.log.Info("limits applied", "cgroup", g.cg.String(), "memory_limit", m, "memory_high", high, "memory_max", max, "pids_max", g.cfg.PidsMax)
	}
	return err
}

var pageSize = uint64(os.Getpagesize())

// keepOwnWeight gives guardian's own container OwnCPUWeight unless it has
// it already (the runtime may write the container's weight again, as
// systemd does when it reloads), at every watch, waiting or guarding. A
// refusal is alerted once until it succeeds.
func (g *Guardian) keepOwnWeight() {
	if g.cfg.OwnCPUWeight == 0 {
		return
	}
	own, err := g.workspace.Own()
	if err == nil && own == nil {
		return
	}
	if err == nil {
		var cur int
		if cur, err = own.CPUWeight(); err == nil && cur != g.cfg.OwnCPUWeight {
			if err = own.SetCPUWeight(g.cfg.OwnCPUWeight); err == nil {
				g.log.Info("own CPU weight set", "cgroup", own.String(), "cpu_weight", g.cfg.OwnCPUWeight, "was", cur)
			}
		}
	}
	g.mu.Lock()
	alerted := g.ownWeightRefused
	g.ownWeightRefused = err != nil
	g.mu.Unlock()
	if err != nil && !alerted {
		g.raise("own-cpu-weight-refused", "", alert.Warning,
			fmt.Sprintf("cannot give guardian's own container CPU weight %d (%v): a busy workspace or node may slow its emergencies", g.cfg.OwnCPUWeight, err), nil)
	}
}
