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

// forkLoop scans the cgroup for process births and contains fork bombs.
func (g *Guardian) forkLoop(ctx context.Context) {
	det := &victim.ForkDetector{Threshold: g.cfg.ForkThreshold, Window: g.cfg.ForkWindow}
	var lastRefused uint64
	if n, err := g.cg.PidsRefused(); err == nil {
		lastRefused = n
	}
	g.every(ctx, "fork", g.cfg.ForkScan, func(ctx context.Context) {
		pids, err := g.cg.Procs()
		if err != nil {
			g.log.Error("fork: list processes", "err", err)
			return
		}
		procs, err := g.procs.Snapshot(pids)
		if err != nil {
			g.log.Error("fork: snapshot", "err", err)
			return
		}
		refused := 0
		if n, err := g.cg.PidsRefused(); err == nil {
			refused = int(n - min(n, lastRefused))
			lastRefused = n
		}
		births, bomb := det.Observe(g.now(), procs, refused)
		if !bomb {
			return
		}
		g.log.Warn("fork bomb detected", "births", births, "window", g.cfg.ForkWindow, "processes", len(procs), "refused_forks", refused)
		res := g.contain(ctx, "fork-bomb")
		g.metrics.bombs.Inc()
		g.mu.Lock()
		g.st.Bombs++
		g.mu.Unlock()
		g.raise("fork-bomb", "", alert.Critical,
			fmt.Sprintf("fork bomb: %d new processes within %v; froze the workspace and killed %d unprotected processes in %d round(s), %v",
				births, g.cfg.ForkWindow, len(res.killed), res.rounds, res.took.Round(time.Millisecond)),
			map[string]string{"births": strconv.Itoa(births), "killed": strconv.Itoa(len(res.killed)), "contained_ms": strconv.FormatInt(res.took.Milliseconds(), 10), "contained": strconv.FormatBool(res.contained)})
		g.metrics.bombContainment.Set(res.took.Seconds())
		det.Reset()
		if n, err := g.cg.PidsRefused(); err == nil {
			lastRefused = n
		}
		g.saveLogged()
	})
}

type containResult struct {
	killed    []int
	rounds    int
	contained bool
	took      time.Duration
}

// contain freezes the cgroup, SIGKILLs every unprotected process, thaws
// and repeats until no unprotected process is left. Freezing first stops a
// bomb from replacing what is killed. The caller must not hold the
// emergency lock.
func (g *Guardian) contain(ctx context.Context, reason string) containResult {
	g.emergency.Lock()
	defer g.emergency.Unlock()
	return g.containLocked(ctx, reason)
}

func (g *Guardian) containLocked(ctx context.Context, reason string) containResult {
	start := g.now()
	var res containResult
	killed := map[victim.Key]bool{}
	for res.rounds = 1; res.rounds <= g.cfg.ContainRounds && ctx.Err() == nil; res.rounds++ {
		fctx, cancel := context.WithTimeout(ctx, g.cfg.FreezeTimeout)
		ferr := g.cg.Freeze(fctx)
		cancel()
		if ferr != nil {
			g.log.Warn("freeze did not complete, killing anyway", "err", ferr)
		}
		procs, prot, err := g.snapshot()
		var victims []victim.Process
		if err == nil {
			victims = victim.Unprotected(procs, prot)
			for _, v := range victims {
				if err := g.killer.Signal(v.Identity, unix.SIGKILL); err == nil && !killed[v.Key()] {
					killed[v.Key()] = true
					res.killed = append(res.killed, v.PID)
				}
			}
		} else {
			g.log.Error("contain: snapshot", "err", err)
		}
		if err := g.cg.Thaw(); err != nil {
			g.log.Error("thaw", "err", err)
		}
		if err == nil && len(victims) == 0 {
			res.contained = true
			break
		}
		g.waitGone(ctx, victims)
	}
	res.took = g.now().Sub(start)
	g.metrics.kills.WithLabelValues(reason).Add(float64(len(res.killed)))
	g.log.Info("containment finished", "reason", reason, "killed", len(res.killed), "rounds", res.rounds, "contained", res.contained, "took_ms", res.took.Milliseconds())
	return res
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
