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

func (g *Guardian) rtPoliceLoop(ctx context.Context) {
	g.every(ctx, "rtpolice", g.cfg.RTPoliceEvery, g.policeRT)
}

// policeRT samples the CPU time of every process guardian gave real-time
// scheduling and demotes one that used more than RTMaxCPUShare of a CPU
// (victim.RTOverBudget) in every sample for RTPoliceFor to SCHED_OTHER at
// nice 0, with an alert. A demoted process is never raised again; a new
// listener (another PID or start time, after sshd restarts) may be. On
// cgroup v1 the cgroup's cpu.rt_runtime_us budget still caps real-time
// use in between.
func (g *Guardian) policeRT(context.Context) {
	now := g.now()
	g.mu.Lock()
	var watch []raisedProc
	for _, r := range g.sshd.raised {
		if r.rt {
			watch = append(watch, r)
		}
	}
	g.mu.Unlock()
	for _, r := range watch {
		p, err := g.procs.Process(r.id.PID)
		if err != nil || p.Key() != r.id.Key() {
			g.forget(r.id.Key())
			continue
		}
		attr, err := g.sched.Get(r.id.PID)
		rt := err == nil && (attr.Policy == unix.SCHED_RR || attr.Policy == unix.SCHED_FIFO)
		prev := r
		r.ticks, r.sampled = p.CPUTicks, now
		if !rt || prev.sampled.IsZero() || p.CPUTicks < prev.ticks {
			r.overSince = time.Time{}
			g.resample(r)
			continue
		}
		share, over := victim.RTOverBudget(victim.RTUsage{Ticks: p.CPUTicks - prev.ticks, Elapsed: now.Sub(prev.sampled)}, g.cfg.RTMaxCPUShare)
		switch {
		case !over:
			r.overSince = time.Time{}
		case r.overSince.IsZero():
			r.overSince = prev.sampled
		}
		if !over || now.Sub(r.overSince) < g.cfg.RTPoliceFor {
			g.resample(r)
			continue
		}
		if err := g.sched.SetOther(r.id.PID, 0); err != nil {
			g.metrics.protectionErrors.WithLabelValues("rt_demote").Inc()
			g.log.Error("demote a real-time process over its CPU share", "pid", r.id.PID, "err", err)
			g.resample(r)
			continue
		}
		g.mu.Lock()
		delete(g.sshd.raised, r.id.Key())
		if g.sshd.demoted == nil {
			g.sshd.demoted = map[victim.Key]bool{}
		}
		g.sshd.demoted[r.id.Key()] = true
		g.mu.Unlock()
		g.raise("rt-demoted", strconv.Itoa(r.id.PID), alert.Critical,
			fmt.Sprintf("pid %d (%s) used more than %.0f%% of a CPU under real-time scheduling for %v (%.0f%% in the last %v); demoted to normal scheduling for good",
				r.id.PID, r.id.Exe, 100*g.cfg.RTMaxCPUShare, now.Sub(r.overSince).Round(time.Millisecond), 100*share, now.Sub(prev.sampled).Round(time.Millisecond)),
			map[string]string{"pid": strconv.Itoa(r.id.PID), "exe": r.id.Exe, "share": strconv.FormatFloat(share, 'f', 3, 64)})
	}
}

// resample stores r's new sample if guardian still tracks it.
func (g *Guardian) resample(r raisedProc) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if cur, ok := g.sshd.raised[r.id.Key()]; ok && cur.rt == r.rt {
		g.sshd.raised[r.id.Key()] = r
	}
}

// forget stops tracking a process that exited.
func (g *Guardian) forget(k victim.Key) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.sshd.raised, k)
}
