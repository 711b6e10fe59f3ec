package guard

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"labkeep/guardian/alert"
	"labkeep/guardian/killer"
	"labkeep/guardian/victim"
)

var errGone = killer.ErrGone

// forkLoop contains fork bombs. It looks at the pids accounting every
// ForkScan, and at once when the kernel notifies a fork refused at
// pids.max (cgroup v2 only; v1 kernels do not notify pids.events, so there
// the scan period alone bounds the reaction). A look reads three small
// files (cgroup.procs, pids.current, pids.events), never the process
// table, so it can run every few tens of milliseconds: a bomb is caught
// while it grows, before it takes the tasks sshd needs for the next login
// (see victim.BombPolicy for what is and is not a bomb).
func (g *Guardian) forkLoop(ctx context.Context) {
	det := &victim.BombDetector{Policy: victim.BombPolicy{
		Limit: g.cfg.PidsMax, Refused: g.cfg.ForkThreshold, Window: g.cfg.ForkWindow,
		GrowthFraction: g.cfg.ForkGrowthFraction, Horizon: g.cfg.ForkHorizon, BranchFraction: g.cfg.ForkBranchFraction,
	}}
	wake, err := g.cg.WatchPids(ctx)
	if err != nil {
		g.log.Debug("fork: no pids.events notifications, polling only", "every", g.cfg.ForkScan, "err", err)
	}
	t := time.NewTicker(g.cfg.ForkScan)
	defer t.Stop()
	for {
		g.forkCheck(ctx, det)
		g.beat("fork")
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case _, ok := <-wake:
			if !ok {
				wake = nil
			}
		}
	}
}

// forkCheck takes one look at the pids accounting and contains a bomb.
// Only while the count is high and growing does it read the process table
// too, to see whether the processes replicate (victim.BombPolicy).
func (g *Guardian) forkCheck(ctx context.Context, det *victim.BombDetector) {
	pids, err := g.cg.Procs()
	if err != nil {
		g.log.Error("fork: list processes", "err", err)
		return
	}
	tasks, err := g.cg.PidsCurrent()
	if err != nil {
		g.log.Error("fork: pids.current", "err", err)
		return
	}
	refused, err := g.cg.PidsRefused()
	if err != nil {
		g.log.Error("fork: pids.events", "err", err)
		return
	}
	g.lowerReserve(tasks)
	v := det.Observe(victim.BombSample{At: g.now(), Procs: len(pids), Tasks: tasks, Refused: refused})
	if v.Growing && !v.Bomb {
		procs, err := g.procs.Snapshot(pids)
		if err != nil {
			g.log.Error("fork: snapshot", "err", err)
			return
		}
		v = det.Branching(v, procs)
	}
	if !v.Bomb {
		return
	}
	g.log.Warn("fork bomb detected", "reason", v.Reason, "processes", len(pids), "tasks", tasks, "pids_max", g.cfg.PidsMax,
		"refused_forks", v.Refused, "growth_per_s", int(v.Rate), "reach_ms", v.Reach.Milliseconds(), "branching_parents", v.Parents, "orphans", v.Orphans)
	res := g.contain(ctx, "fork-bomb")
	g.metrics.bombs.Inc()
	g.mu.Lock()
	g.st.Bombs++
	g.mu.Unlock()
	why := fmt.Sprintf("%d forks refused at pids.max %d within %v", v.Refused, g.cfg.PidsMax, g.cfg.ForkWindow)
	switch v.Reason {
	case "growth":
		why = fmt.Sprintf("%d processes growing by %d/s, pids.max %d within %v", len(pids), int(v.Rate), g.cfg.PidsMax, v.Reach.Round(time.Millisecond))
	case "exhausted":
		why = fmt.Sprintf("%d processes hold every task pids.max %d allows and a fork was refused", len(pids), g.cfg.PidsMax)
	case "branching":
		why = fmt.Sprintf("%d processes growing by %d/s, %d of them each starting two or more of the others", len(pids), int(v.Rate), v.Parents)
	case "orphans":
		why = fmt.Sprintf("%d processes growing by %d/s, %d of them outliving the parent that started them", len(pids), int(v.Rate), v.Orphans)
	}
	g.raise("fork-bomb", "", alert.Critical,
		fmt.Sprintf("fork bomb: %s; froze the workspace and killed %d unprotected processes in %d round(s), %v",
			why, len(res.killed), res.rounds, res.took.Round(time.Millisecond)),
		map[string]string{"reason": v.Reason, "processes": strconv.Itoa(len(pids)), "refused": strconv.Itoa(v.Refused),
			"killed": strconv.Itoa(len(res.killed)), "contained_ms": strconv.FormatInt(res.took.Milliseconds(), 10), "contained": strconv.FormatBool(res.contained)})
	g.metrics.bombContainment.Set(res.took.Seconds())
	det.Reset()
	g.saveLogged()
}

// holdForks sets pids.max to 0 for the rest of a containment's first
// round when its freeze did not complete within HoldForksAfter
// (freezeFirst): from then on no fork in the workspace succeeds, so what
// the round kills is all there is (the snapshot is taken after the hold)
// and nothing it misses can replace it. A freeze that drags on does not
// do that — on the emulated v2 node a bomb of 500 processes, still
// freezing after guardian's freeze timeout, forked on to 2,900 while
// guardian killed. The kernel checks pids.max at each fork, so the hold
// needs none of the bomb's processes to run, as a freeze does.
//
// The hold refuses sshd's forks too, and sshd closes a connection it
// cannot fork for: on the emulated v2 node, where such a freeze took
// 0.5–2.2 s, two logins were reset so. So the verified listener is
// stopped (SIGSTOP) before the hold and continued just after it, before
// the thaw: meanwhile the kernel completes new connections into the
// listening socket's backlog, and the listener accepts them once it can
// fork, which a student sees as a slower login, not a failed one. Should
// guardian die in between, the protector of the next guardian continues
// a stopped listener as it continues any stopped protected process. The
// caller holds the emergency lock; releaseForks ends the hold.
func (g *Guardian) holdForks() {
	g.mu.Lock()
	g.forksHeld = true
	l := g.listener
	g.heldListener = l // before the signal: the protector leaves it stopped from then
	g.mu.Unlock()
	if l.PID != 0 {
		if err := g.killer.Signal(l, unix.SIGSTOP); err != nil {
			g.log.Warn("fork: stop the sshd listener while forks are held", "pid", l.PID, "err", err)
			g.mu.Lock()
			g.heldListener = victim.Identity{}
			g.mu.Unlock()
		}
	}
	if err := g.cg.SetPidsMax(0); err != nil {
		g.log.Warn("fork: hold forks while containing", "err", err)
	}
}

// releaseForks runs once per containment, before the first thaw: it ends
// holdForks and continues the listener it stopped, so sshd, thawed with
// the connections that queued up meanwhile, can fork for them. Killed
// processes keep their pids until they are reaped, which is up to their
// reaper (the Pod's PID 1), so right after the thaw the workspace may
// still be at the limit: within PidsReserve of it, pids.max is lifted by
// PidsReserve until lowerReserve gives it back. Nothing else forks into
// the reserve: what was killed dies at its next step, and what was not
// is protected or a small login.
func (g *Guardian) releaseForks() {
	g.mu.Lock()
	held := g.forksHeld
	g.forksHeld = false
	g.mu.Unlock()
	raise := false
	if tasks, err := g.cg.PidsCurrent(); err == nil && tasks >= g.cfg.PidsMax-g.cfg.PidsReserve && g.cfg.PidsReserve > 0 {
		raise = true
		g.mu.Lock()
		g.reserveSince = g.now()
		g.mu.Unlock()
		g.log.Info("pids.max raised by the reserve after containing", "tasks", tasks, "pids_max", g.pidsMax())
	}
	if !held && !raise {
		return
	}
	if err := g.cg.SetPidsMax(g.pidsMax()); err != nil {
		g.log.Warn("fork: release forks after containing", "err", err)
	}
	g.mu.Lock()
	l := g.heldListener
	g.heldListener = victim.Identity{}
	g.mu.Unlock()
	if l.PID != 0 {
		if err := g.killer.Signal(l, unix.SIGCONT); err != nil {
			g.log.Warn("fork: continue the sshd listener after the hold", "pid", l.PID, "err", err)
		}
	}
}

// lowerReserve puts pids.max back once the killed processes were reaped
// (tasks back below the limit by the reserve), or after ForkWindow at the
// latest, whatever the workspace runs by then.
func (g *Guardian) lowerReserve(tasks int) {
	g.mu.Lock()
	since := g.reserveSince
	if since.IsZero() || (tasks > g.cfg.PidsMax-g.cfg.PidsReserve && g.now().Sub(since) < g.cfg.ForkWindow) {
		g.mu.Unlock()
		return
	}
	g.reserveSince = time.Time{}
	g.mu.Unlock()
	if err := g.cg.SetPidsMax(g.cfg.PidsMax); err != nil {
		g.log.Warn("fork: lower pids.max after containment", "err", err)
		return
	}
	g.log.Info("pids.max back after containment", "tasks", tasks, "pids_max", g.cfg.PidsMax)
}

// pidsMax is the pids.max guardian wants now: PidsMax, plus PidsReserve
// while a containment holds the reserve open, 0 while it holds forks.
func (g *Guardian) pidsMax() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.forksHeld {
		return 0
	}
	if g.reserveSince.IsZero() {
		return g.cfg.PidsMax
	}
	return g.cfg.PidsMax + g.cfg.PidsReserve
}

type containResult struct {
	killed    []int
	rounds    int
	contained bool
	took      time.Duration
	// Where the time went, over every round: freezing, reading the
	// processes, signalling them, thawing, waiting for them to leave.
	freeze, read, signal, thaw, gone time.Duration
	// sessions is the most sshd connection processes a round protected,
	// noListener the rounds whose snapshot held no verified listener (then
	// no connection is protected), sshdKilled the killed processes that
	// ran the listener's executable path (an impostor, or a connection
	// guardian could not verify): they say whether logins were spared.
	sessions, noListener, sshdKilled int
}

// contain freezes the cgroup, SIGKILLs every unprotected process but small
// logins at work (Config.SpareLoginMax), thaws and repeats until none is
// left; where the first freeze is slow, every fork is held until the
// first thaw (holdForks): the hold and the freeze stop a bomb from
// replacing what is killed. The caller must not hold the emergency lock.
func (g *Guardian) contain(ctx context.Context, reason string) containResult {
	g.emergency.Lock()
	defer g.emergency.Unlock()
	return g.containLocked(ctx, reason, g.cfg.SpareLoginMax)
}

// containLocked is contain with the emergency lock held; login subtrees of
// at most spareLogins processes survive it (victim.SpareSmallLogins).
func (g *Guardian) containLocked(ctx context.Context, reason string, spareLogins int) containResult {
	start := g.now()
	var res containResult
	killed := map[victim.Key]bool{}
	for res.rounds = 1; res.rounds <= g.cfg.ContainRounds && ctx.Err() == nil; res.rounds++ {
		phase := time.Now()
		lap := func(d *time.Duration) {
			now := time.Now()
			*d += now.Sub(phase)
			phase = now
		}
		var ferr error
		if res.rounds == 1 {
			ferr = g.freezeFirst(ctx)
		} else {
			fctx, cancel := context.WithTimeout(ctx, g.cfg.FreezeTimeout)
			ferr = g.cg.Freeze(fctx)
			cancel()
		}
		if ferr != nil {
			g.log.Warn("freeze did not complete, killing anyway", "err", ferr)
		}
		lap(&res.freeze)
		procs, prot, err := g.snapshot()
		lap(&res.read)
		var victims []victim.Process
		if err == nil {
			sshdExe, sessions := sshdSeen(procs, prot)
			if sshdExe == "" {
				res.noListener++
			}
			victims = victim.SpareSmallLogins(procs, prot, spareLogins)
			for _, v := range victims {
				g.letDie(v.Identity)
				if err := g.killer.Signal(v.Identity, unix.SIGKILL); err == nil && !killed[v.Key()] {
					killed[v.Key()] = true
					res.killed = append(res.killed, v.PID)
					if sshdExe != "" && v.Exe == sshdExe {
						res.sshdKilled++
					}
				}
			}
			res.sessions = max(res.sessions, sessions)
		} else {
			g.log.Error("contain: snapshot", "err", err)
		}
		lap(&res.signal)
		if res.rounds == 1 {
			g.releaseForks() // the only round that can hold forks (freezeFirst)
		}
		if err := g.cg.Thaw(); err != nil {
			g.log.Error("thaw", "err", err)
		}
		lap(&res.thaw)
		if err == nil && len(victims) == 0 {
			res.contained = true
			break
		}
		g.waitGone(ctx, victims)
		lap(&res.gone)
	}
	res.took = g.now().Sub(start)
	g.metrics.kills.WithLabelValues(reason).Add(float64(len(res.killed)))
	g.log.Info("containment finished", "reason", reason, "killed", len(res.killed), "rounds", res.rounds, "contained", res.contained, "took_ms", res.took.Milliseconds(),
		"freeze_ms", res.freeze.Milliseconds(), "read_ms", res.read.Milliseconds(), "signal_ms", res.signal.Milliseconds(), "thaw_ms", res.thaw.Milliseconds(), "gone_ms", res.gone.Milliseconds(),
		"sessions_protected", res.sessions, "rounds_without_listener", res.noListener, "sshd_exe_killed", res.sshdKilled)
	return res
}

// sshdSeen returns the verified listener's executable path in a
// containment's snapshot ("" when it holds none) and how many sshd
// connection processes it protects.
func sshdSeen(procs []victim.Process, prot victim.Protected) (exe string, sessions int) {
	for _, p := range procs {
		switch prot[p.Key()] {
		case victim.ReasonListener:
			exe = p.Exe
		case victim.ReasonSession:
			sessions++
		}
	}
	return exe, sessions
}

// freezeFirst freezes the workspace for a containment's first round,
// within FreezeTimeout, holding forks (holdForks) once HoldForksAfter has
// passed without the freeze completing.
func (g *Guardian) freezeFirst(ctx context.Context) error {
	fctx, cancel := context.WithTimeout(ctx, g.cfg.FreezeTimeout)
	defer cancel()
	hctx, hcancel := context.WithTimeout(fctx, g.cfg.HoldForksAfter)
	err := g.cg.Freeze(hctx)
	hcancel()
	if err == nil || fctx.Err() != nil {
		return err
	}
	g.holdForks()
	return g.cg.Freeze(fctx)
}

// waitGone waits (up to a second) until the killed processes have left the
// cgroup, so the next round sees only newcomers.
func (g *Guardian) waitGone(ctx context.Context, victims []victim.Process) {
	want := map[int]bool{}
	for _, v := range victims {
		want[v.PID] = true
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		pids, err := g.cg.Procs()
		if err != nil {
			return
		}
		left := 0
		for _, p := range pids {
			if want[p] {
				left++
			}
		}
		if left == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
