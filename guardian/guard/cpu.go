package guard

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"labkeep/guardian/alert"
	"labkeep/guardian/killer"
	"labkeep/guardian/victim"
)

// cpuLoop measures the workspace's CPU use and escalates a hang: CPU above
// the threshold while SSH is unreachable.
func (g *Guardian) cpuLoop(ctx context.Context) {
	var last cpuLook
	g.every(ctx, "cpu", g.cfg.CPUEvery, func(ctx context.Context) {
		s, ok := g.sampleCPU("cpu", &last)
		if !ok {
			return
		}
		now, frac, procs, prot := s.at, s.frac, s.procs, s.prot
		g.metrics.cpuFraction.Set(frac)
		// SSH matters only with CPU above the threshold (the tracker
		// ignores it otherwise), so only then is it probed now; below,
		// the prober loop's last result is passed as it stands.
		probed, sshOK := frac > g.cfg.Hang.CPUFraction, false
		if probed {
			sshOK = g.probeOnce(ctx)
		}
		g.mu.Lock()
		if !probed {
			sshOK = g.sshOK
		}
		act := g.st.Hang.Observe(now, frac, sshOK)
		g.mu.Unlock()
		if !act.Alert {
			return
		}
		g.raise("cpu-hang", "", alert.Critical,
			fmt.Sprintf("workspace CPU at %.0f%% and SSH unreachable for %v", 100*frac, act.Hung.Round(time.Second)),
			map[string]string{"hung_s": strconv.Itoa(int(act.Hung.Seconds())), "kill": strconv.Itoa(act.Kill)})
		if act.Kill != 0 {
			g.killTopCPU(ctx, s.prev, procs, prot, act.Kill)
		}
		g.saveLogged()
	})
}

// cpuLook is one look at the workspace's CPU: the cgroup's usage counter
// and the process snapshot, and when.
type cpuLook struct {
	usage time.Duration
	at    time.Time
	procs []victim.Process
}

// cpuSample is what two looks in a row tell: the share of the workspace's
// CPU capacity used between them (victim.CPUFraction) and the snapshots at
// both ends, with the protected set of the newer one.
type cpuSample struct {
	at      time.Time
	elapsed time.Duration
	frac    float64
	cpus    float64 // the workspace's capacity in CPUs
	prev    []victim.Process
	procs   []victim.Process
	prot    victim.Protected
}

// sampleCPU takes a new look, keeps it in last for the next call and
// returns the sample since the previous one; ok is false on the first
// look and when a read fails (logged under loop's name).
func (g *Guardian) sampleCPU(loop string, last *cpuLook) (s cpuSample, ok bool) {
	usage, err := g.cg.CPUUsage()
	if err != nil {
		g.log.Error(loop+": read CPU usage", "err", err)
		return s, false
	}
	now := g.now()
	procs, prot, err := g.snapshot()
	if err != nil {
		g.log.Error(loop+": snapshot", "err", err)
		return s, false
	}
	prev := *last
	*last = cpuLook{usage: usage, at: now, procs: procs}
	if prev.at.IsZero() {
		return s, false
	}
	cpus, err := g.cg.CPUs()
	if err != nil || cpus == 0 || cpus > g.cpus {
		cpus = g.cpus
	}
	elapsed := now.Sub(prev.at)
	return cpuSample{at: now, elapsed: elapsed, frac: victim.CPUFraction(usage-prev.usage, elapsed, cpus), cpus: cpus,
		prev: prev.procs, procs: procs, prot: prot}, true
}

// killTopCPU terminates the n busiest unprotected processes (all of them
// for n < 0) concurrently, each with the usual grace period.
func (g *Guardian) killTopCPU(ctx context.Context, prev, cur []victim.Process, prot victim.Protected, n int) {
	g.emergency.Lock()
	defer g.emergency.Unlock()
	targets := victim.TopCPU(prev, cur, prot, n)
	var wg sync.WaitGroup
	for _, v := range targets {
		g.letDie(v.Identity)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := g.killer.Terminate(ctx, v.Identity, killer.Plan{Grace: g.cfg.KillGrace, KillWait: g.cfg.KillWait}); err != nil {
				g.log.Warn("cpu victim not killed", "pid", v.PID, "err", err)
				return
			}
			g.metrics.kills.WithLabelValues("cpu").Inc()
			g.log.Info("cpu victim killed", "pid", v.PID, "exe", v.Exe, "comm", v.Comm)
		}()
	}
	wg.Wait()
	g.mu.Lock()
	g.st.Kills += len(targets)
	g.mu.Unlock()
}

// probeLoop probes SSH every ProbeEvery and alerts when it becomes
// unreachable.
func (g *Guardian) probeLoop(ctx context.Context) {
	g.every(ctx, "probe", g.cfg.ProbeEvery, func(ctx context.Context) { g.probeOnce(ctx) })
}

// probeOnce probes SSH, records the result and raises an alert on the
// transition to unreachable (repeats aggregate).
func (g *Guardian) probeOnce(ctx context.Context) bool {
	_, took, err := g.probe.Probe(ctx)
	g.metrics.sshProbeSeconds.Set(took.Seconds())
	ok := err == nil
	g.mu.Lock()
	was := g.sshOK
	g.sshOK = ok
	g.mu.Unlock()
	if ok {
		g.metrics.sshUp.Set(1)
		if !was {
			g.raise("ssh-reachable", "", alert.Info, "SSH is reachable again", nil)
		}
		return true
	}
	g.metrics.sshUp.Set(0)
	g.raise("ssh-unreachable", "", alert.Critical, fmt.Sprintf("SSH probe failed: %v", err), nil)
	return false
}
