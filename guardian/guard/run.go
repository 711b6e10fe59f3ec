package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"labkeep/guardian/alert"
	"labkeep/guardian/cgroupfs"
	"labkeep/guardian/victim"
)

// Workspace locates the workspace container's cgroup
// (cgroupfs.PodWorkspace and cgroupfs.Explicit implement it). The
// container may not exist yet (guardian starts first, as a native sidecar)
// and gets a new cgroup each time it restarts.
type Workspace interface {
	// Find returns the workspace's current cgroup, or an error while it
	// has none.
	Find() (cgroupfs.Cgroup, error)
	// Own returns guardian's own container cgroup, or nil (and no error)
	// where guardian is not in a Pod and its siblings are unknown.
	Own() (cgroupfs.Cgroup, error)
}

// Run guards the workspace until ctx ends: it waits for the workspace's
// cgroup, attaches to it, runs the loops while the cgroup has processes,
// and when it has none (the container ended; a restarted one has a new
// cgroup) goes back to waiting. Each check happens every WatchEvery. It
// returns an error only when guardian cannot work at all
// (ErrNoMemoryLimit).
func (g *Guardian) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var alerts sync.WaitGroup
	alerts.Add(1)
	go func() {
		defer alerts.Done()
		g.alerts.Run(ctx)
	}()
	defer alerts.Wait()
	defer cancel()
	defer g.saveLogged()
	for {
		cg, ok := g.awaitWorkspace(ctx)
		if !ok {
			return nil
		}
		if err := g.Attach(ctx, cg); err != nil {
			g.detach()
			if errors.Is(err, ErrNoMemoryLimit) {
				return err
			}
			// The cgroup went away while guardian attached (a container
			// restarting again): look again after a watch period.
			g.log.Warn("attach failed, looking again", "cgroup", cg.String(), "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(g.cfg.WatchEvery):
			}
			continue
		}
		g.metrics.guarded.Set(1)
		g.metrics.attaches.Inc()
		g.guard(ctx, cg)
		g.detach()
		g.metrics.guarded.Set(0)
		if ctx.Err() != nil {
			return nil
		}
		g.raise("workspace-gone", "", alert.Warning,
			fmt.Sprintf("the workspace's cgroup %s has no process left (container ended or restarting); waiting for the new one", cg), nil)
	}
}

// awaitWorkspace asks for the workspace's cgroup every WatchEvery until it
// has one with processes in it; false when ctx ended first.
func (g *Guardian) awaitWorkspace(ctx context.Context) (cgroupfs.Cgroup, bool) {
	t := time.NewTicker(g.cfg.WatchEvery)
	defer t.Stop()
	logged := ""
	for {
		g.keepOwnWeight()
		cg, err := g.workspace.Find()
		if err == nil && live(cg) {
			return cg, true
		}
		if err == nil {
			err = fmt.Errorf("%s has no process", cg)
		}
		g.mu.Lock()
		g.waiting = err
		g.mu.Unlock()
		if err.Error() != logged {
			g.log.Info("waiting for the workspace container", "err", err)
			logged = err.Error()
		}
		g.beat("watch")
		select {
		case <-ctx.Done():
			return nil, false
		case <-t.C:
		}
	}
}

// live reports whether cg still exists and holds a process.
func live(cg cgroupfs.Cgroup) bool {
	pids, err := cg.Procs()
	return err == nil && len(pids) > 0
}

// guard runs the loops over cg until ctx ends or cg has no process left.
// The watch also puts guardian's limits back should anything (the
// runtime finishing the container's set-up) have written others.
func (g *Guardian) guard(ctx context.Context, cg cgroupfs.Cgroup) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	loops := []struct {
		name string
		run  func(context.Context)
	}{
		{"watch", func(ctx context.Context) {
			g.every(ctx, "watch", g.cfg.WatchEvery, func(context.Context) {
				if !live(cg) {
					g.log.Warn("workspace cgroup gone", "cgroup", cg.String())
					cancel()
					return
				}
				// Cheap when nothing changed (two reads); a failure is
				// left to the protector to alert and retry.
				_ = g.applyLimits()
				g.keepOwnWeight()
				// OOM handling too: guardian may attach between runc
				// placing the container's first process in its cgroup and
				// writing the container's settings, memory.oom.group = 1
				// among them (seen on a v2 node). Attach alerted once if
				// the kernel refuses it.
				if g.cfg.HandleOOM {
					_ = cg.HandleOOM()
				}
			})
		}},
		{"protect", g.protectLoop},
		{"rtpolice", g.rtPoliceLoop},
		{"memory", g.memoryLoop},
		{"fork", g.forkLoop},
		{"cpu", g.cpuLoop},
		{"storm", g.stormLoop},
		{"probe", g.probeLoop},
	}
	for _, l := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.run(ctx)
		}()
	}
	wg.Wait()
}

// every runs f at once and then every d until ctx ends, recording a
// heartbeat for /healthz.
func (g *Guardian) every(ctx context.Context, name string, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		f(ctx)
		g.beat(name)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (g *Guardian) beat(name string) {
	g.mu.Lock()
	g.heartbeats[name] = g.now()
	g.mu.Unlock()
}

// ErrUnhealthy is wrapped by Healthy's and Live's errors: guardian is not
// protecting the workspace as it should.
var ErrUnhealthy = errors.New("guardian is not healthy")

// Healthy returns nil when guardian guards a live workspace cgroup and
// every loop has run within three of its periods (emergency actions may
// hold a loop for a while), else an error wrapping ErrUnhealthy that says
// what is missing. It answers readiness: not ready while the workspace
// container has not started or is restarting.
func (g *Guardian) Healthy() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cg == nil {
		return fmt.Errorf("no live workspace cgroup guarded (%v): %w", g.waiting, ErrUnhealthy)
	}
	return g.stalled(map[string]time.Duration{"watch": g.cfg.WatchEvery, "protect": g.cfg.ProtectEvery, "memory": g.cfg.MemoryPoll,
		"fork": g.cfg.ForkScan, "cpu": g.cfg.CPUEvery, "probe": g.cfg.ProbeEvery})
}

// Live returns nil while guardian's watch on the workspace runs, whether
// or not the workspace exists, else an error wrapping ErrUnhealthy. It
// answers start-up and liveness: guardian must count as started before
// the workspace container exists, since the kubelet starts that container
// only after its native sidecars.
func (g *Guardian) Live() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stalled(map[string]time.Duration{"watch": g.cfg.WatchEvery})
}

// stalled reports the first loop of periods without a heartbeat within
// three periods plus the time an emergency action may hold it. The caller
// holds g.mu.
func (g *Guardian) stalled(periods map[string]time.Duration) error {
	now := g.now()
	for name, p := range periods {
		last, ok := g.heartbeats[name]
		limit := 3*p + g.cfg.KillGrace + g.cfg.KillWait + g.cfg.FreezeTimeout
		if !ok || now.Sub(last) > limit {
			return fmt.Errorf("%s loop last ran %v ago: %w", name, now.Sub(last).Round(time.Millisecond), ErrUnhealthy)
		}
	}
	return nil
}

// Alerts returns the recent alerts, oldest first.
func (g *Guardian) Alerts() []alert.Alert { return g.alerts.Recent() }

func (g *Guardian) raise(kind, subject string, sev alert.Severity, msg string, fields map[string]string) {
	g.alerts.Raise(kind, subject, sev, msg, fields)
	g.metrics.alerts.WithLabelValues(kind).Inc()
}

// snapshot reads the cgroup's processes and computes the protected set.
func (g *Guardian) snapshot() ([]victim.Process, victim.Protected, error) {
	pids, err := g.cg.Procs()
	if err != nil {
		return nil, nil, fmt.Errorf("list processes: %w", err)
	}
	procs, err := g.procs.Snapshot(pids)
	if err != nil {
		return nil, nil, err
	}
	g.mu.Lock()
	rules := victim.Rules{
		ProtectPID1: g.cfg.ProtectPID1, ProtectInit: g.cfg.ProtectInit, Listener: g.listener,
		SessionExes: g.cfg.SessionExes, SessionDepth: 2, Self: g.self, Exes: g.cfg.ProtectExes,
	}
	g.mu.Unlock()
	prot := victim.Protect(procs, rules)
	g.dropUnverifiedSessions(procs, prot)
	return procs, prot, nil
}
