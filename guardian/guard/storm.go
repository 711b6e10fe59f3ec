package guard

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"labkeep/guardian/alert"
	"labkeep/guardian/victim"
)

// stormLoop keeps SSH usable while the workspace's CPU is saturated: every
// StormEvery it measures the workspace's CPU share and, while it is at the
// quota, demotes the unprotected processes that use CPU to SCHED_IDLE
// (victim.StormPolicy says who and why); after the storm they get normal
// scheduling back. A login's processes and sshd's then win the CPU at
// once instead of queueing behind every spinner of the quota. The user,
// without CAP_SYS_NICE, cannot leave SCHED_IDLE, and the demotion is
// re-applied at every look (to the threads started since, too). Nothing
// is killed: that stays the hang escalation's call (cpu.go).
//
// Scheduling is set by PID right after the snapshot that named the
// process; a PID reused within that instant would have its CPU priority
// lowered or restored, never anything worse.
func (g *Guardian) stormLoop(ctx context.Context) {
	tr := &victim.StormTracker{Policy: g.cfg.Storm}
	var last cpuLook
	storming := false
	g.every(ctx, "storm", g.cfg.StormEvery, func(ctx context.Context) {
		s, ok := g.sampleCPU("storm", &last)
		if !ok {
			return
		}
		frac := s.frac
		act := tr.Observe(s.at, frac, s.cpus, s.elapsed, s.prev, s.procs, s.prot)
		dying := g.stillDying()
		demoted := 0
		for _, p := range act.Demote {
			if dying[p.Key()] {
				continue
			}
			// Applied again even to a process already demoted: a thread it
			// started since, or one in creation during the last walk, may
			// still run at normal priority.
			a, err := g.sched.Get(p.PID)
			again := err == nil && a.Policy == unix.SCHED_IDLE
			if err := g.sched.SetIdleProcess(p.PID); err != nil {
				g.log.Debug("storm: demote", "pid", p.PID, "err", err)
				continue
			}
			if !again {
				demoted++
			}
		}
		for _, p := range act.Restore {
			if err := g.sched.SetNormalProcess(p.PID); err != nil {
				g.log.Debug("storm: restore", "pid", p.PID, "err", err)
			}
		}
		switch {
		case !storming && len(act.Demote) > 0:
			storming = true
			g.log.Warn("CPU storm: demoting busy processes to SCHED_IDLE", "cpu_fraction", frac, "demoted", demoted)
			g.raise("cpu-storm", "", alert.Warning,
				fmt.Sprintf("workspace CPU at %.0f%% of its quota: %d busy processes run at SCHED_IDLE until it calms down, so logins keep working", 100*frac, demoted),
				map[string]string{"demoted": strconv.Itoa(demoted)})
		case storming && len(act.Demote) == 0:
			storming = false
			g.log.Info("CPU storm over: normal scheduling back", "restored", len(act.Restore))
		case demoted > 0:
			g.log.Info("CPU storm: demoted more", "demoted", demoted, "total", tr.Demoted())
		}
	})
}

// letDie gives a process about to be killed its normal scheduling back if
// a CPU storm demoted it to SCHED_IDLE, and keeps the storm from demoting
// it again while it dies (dying): a killed process must still run to exit
// and free its memory, and at SCHED_IDLE beside a saturated quota it waits
// for the CPU (seen on an emulated node: alive 5 s after SIGKILL, its
// memory still held). By PID, right after the snapshot that named it, as
// the storm's own demotion: a reused PID at worst gets normal scheduling.
func (g *Guardian) letDie(id victim.Identity) {
	g.mu.Lock()
	if g.dying == nil {
		g.dying = map[victim.Key]time.Time{}
	}
	g.dying[id.Key()] = g.now()
	g.mu.Unlock()
	a, err := g.sched.Get(id.PID)
	if err != nil || a.Policy != unix.SCHED_IDLE {
		return
	}
	if err := g.sched.SetNormalProcess(id.PID); err != nil {
		g.log.Debug("normal scheduling before a kill", "pid", id.PID, "err", err)
	}
}

// stillDying is the set of processes guardian is killing (letDie), once
// the kills older than a kill takes (grace and wait) are forgotten.
func (g *Guardian) stillDying() map[victim.Key]bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[victim.Key]bool, len(g.dying))
	for k, since := range g.dying {
		if g.now().Sub(since) > g.cfg.KillGrace+g.cfg.KillWait {
			delete(g.dying, k)
			continue
		}
		out[k] = true
	}
	return out
}
