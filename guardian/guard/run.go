package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"labkeep/guardian/alert"
	"labkeep/guardian/victim"
)

// Run runs the loops until ctx ends.
func (g *Guardian) Run(ctx context.Context) {
	var wg sync.WaitGroup
	loops := []struct {
		name string
		run  func(context.Context)
	}{
		{"alerts", g.alerts.Run},
		{"protect", g.protectLoop},
		{"memory", g.memoryLoop},
		{"fork", g.forkLoop},
		{"cpu", g.cpuLoop},
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
	if err := g.save(); err != nil {
		g.log.Error("save state", "err", err)
	}
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

// ErrUnhealthy is wrapped by Healthy's error: guardian is not protecting
// the workspace as it should.
var ErrUnhealthy = errors.New("guardian is not healthy")

// Healthy returns nil when every loop has run within three of its periods
// (emergency actions may hold a loop for a while), else an error wrapping
// ErrUnhealthy that names the stalled loop.
func (g *Guardian) Healthy() error {
	periods := map[string]time.Duration{"protect": g.cfg.ProtectEvery, "memory": g.cfg.MemoryPoll, "fork": g.cfg.ForkScan, "cpu": g.cfg.CPUEvery, "probe": g.cfg.ProbeEvery}
	g.mu.Lock()
	defer g.mu.Unlock()
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
	return procs, victim.Protect(procs, rules), nil
}
