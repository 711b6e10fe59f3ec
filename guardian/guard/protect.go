package guard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"labkeep/guardian/alert"
	"labkeep/guardian/victim"
)

// oomProtected and oomSelf are the oom_score_adj values for protected
// processes and for guardian itself.
const (
	oomProtected = -1000
	oomSelf      = -999
)

func (g *Guardian) protectLoop(ctx context.Context) {
	g.every(ctx, "protect", g.cfg.ProtectEvery, g.protect)
}

// protect finds the sshd listener by its socket, gives it real-time
// scheduling (or the nice fallback), sets oom_score_adj on the protected
// set and re-applies anything the user changed.
func (g *Guardian) protect(ctx context.Context) {
	g.mu.Lock()
	pending := g.limitsPending
	g.mu.Unlock()
	if pending {
		if err := g.applyLimits(); err != nil {
			g.raise("limits-not-applied", "", alert.Critical, fmt.Sprintf("kernel limits still not applied: %v", err), nil)
		}
	}
	pids, err := g.cg.Procs()
	if err != nil {
		g.log.Error("protect: list processes", "err", err)
		return
	}
	g.findListener(pids)
	procs, prot, err := g.snapshot()
	if err != nil {
		g.log.Error("protect: snapshot", "err", err)
		return
	}
	g.metrics.protected.Set(float64(len(prot)))
	g.metrics.processes.Set(float64(len(procs)))

	// A stopped sshd (SIGSTOP from the user, same uid) holds its socket
	// but answers nothing; a stopped init freezes the container.
	for _, p := range procs {
		reason, ok := prot[p.Key()]
		if !ok || reason == victim.ReasonSelf || p.State != "T" {
			continue
		}
		if err := g.killer.Signal(p.Identity, unix.SIGCONT); err != nil {
			g.log.Warn("continue stopped process", "pid", p.PID, "err", err)
			continue
		}
		g.raise("protected-stopped", string(reason), alert.Warning,
			fmt.Sprintf("protected process %d (%s, %s) was stopped; continued it", p.PID, reason, p.Exe), nil)
	}

	g.mu.Lock()
	listener, rtRefused := g.listener, g.rtRefused
	g.mu.Unlock()
	if listener.PID != 0 {
		g.protectScheduling(listener, rtRefused)
	}
	for _, p := range procs {
		reason, ok := prot[p.Key()]
		want := 0
		switch {
		case ok && reason == victim.ReasonSelf:
			want = oomSelf
		case ok && (reason == victim.ReasonListener || reason == victim.ReasonPID1 || reason == victim.ReasonInit):
			want = oomProtected
		case ok:
			continue // sessions and configured processes keep what they have
		}
		cur, err := g.procs.OOMScoreAdj(p.PID)
		if err != nil || cur == want {
			continue
		}
		if !ok {
			// An unprotected process inherits -1000 from a protected parent
			// (init's children); give it back the default. Other values,
			// such as kubelet's QoS scores, are left alone.
			if cur != oomProtected && cur != oomSelf {
				continue
			}
		}
		g.setOOM(p, want, cur)
	}
	if self, err := g.procs.OOMScoreAdj(os.Getpid()); err == nil && self != oomSelf {
		g.setOOM(victim.Process{Identity: victim.Identity{PID: os.Getpid()}, Comm: "guardian"}, oomSelf, self)
	}
}

func (g *Guardian) setOOM(p victim.Process, want, cur int) {
	if err := g.procs.SetOOMScoreAdj(p.PID, want); err != nil {
		g.metrics.protectionErrors.WithLabelValues("oom_score_adj").Inc()
		if errors.Is(err, os.ErrPermission) {
			g.raise("oom-protection-unavailable", "", alert.Warning,
				fmt.Sprintf("cannot set oom_score_adj %d (needs CAP_SYS_RESOURCE): %v", want, err), nil)
			return
		}
		g.log.Warn("set oom_score_adj", "pid", p.PID, "want", want, "err", err)
		return
	}
	g.log.Info("oom_score_adj set", "pid", p.PID, "exe", p.Exe, "from", cur, "to", want)
}

// findListener identifies the process holding the SSH listening socket.
// The cached listener is kept while it still holds one; otherwise every
// process in the cgroup is searched. A listener that disappears raises an
// alert.
func (g *Guardian) findListener(pids []int) {
	inodes, err := g.procs.ListeningInodes(g.cfg.SSHPort)
	if err != nil {
		g.log.Error("read listening sockets", "err", err)
		return
	}
	g.mu.Lock()
	cached := g.listener
	g.mu.Unlock()
	var found victim.Identity
	if cached.PID != 0 {
		if pid, ok := g.procs.SocketOwner([]int{cached.PID}, inodes); ok {
			if p, err := g.procs.Process(pid); err == nil && p.Identity == cached {
				found = cached
			}
		}
	}
	if found.PID == 0 {
		if pid, ok := g.procs.SocketOwner(pids, inodes); ok {
			if p, err := g.procs.Process(pid); err == nil {
				found = p.Identity
			}
		}
	}
	g.mu.Lock()
	had := g.hadSSHD
	g.listener = found
	if found.PID != 0 {
		g.hadSSHD = true
	}
	g.mu.Unlock()
	switch {
	case found.PID == 0 && had:
		g.raise("sshd-gone", "", alert.Critical, fmt.Sprintf("the SSH listener on port %d is gone from the workspace (was %v)", g.cfg.SSHPort, cached), nil)
		g.mu.Lock()
		g.hadSSHD = false
		g.mu.Unlock()
	case found.PID == 0:
		g.raise("sshd-not-found", "", alert.Warning, fmt.Sprintf("no process in the workspace listens on port %d", g.cfg.SSHPort), nil)
	case found != cached:
		g.log.Info("sshd listener", "pid", found.PID, "exe", found.Exe, "start", found.StartTime)
	}
}

// protectScheduling keeps the listener at SCHED_RR|SCHED_RESET_ON_FORK,
// or at the fallback nice value where real-time is refused.
func (g *Guardian) protectScheduling(l victim.Identity, rtRefused bool) {
	attr, err := g.sched.Get(l.PID)
	if err != nil {
		return
	}
	if attr.IsRR(g.cfg.RTPriority) {
		return
	}
	if !rtRefused {
		err := g.sched.SetRR(l.PID, g.cfg.RTPriority)
		if err == nil {
			g.log.Info("sshd listener set to SCHED_RR", "pid", l.PID, "priority", g.cfg.RTPriority, "was_policy", attr.Policy)
			return
		}
		g.metrics.protectionErrors.WithLabelValues("sched_rr").Inc()
		g.raise("sshd-rt-refused", "", alert.Warning,
			fmt.Sprintf("SCHED_RR refused for sshd (pid %d): %v; falling back to nice %d", l.PID, err, g.cfg.FallbackNice), nil)
	}
	if attr.Nice == g.cfg.FallbackNice {
		return
	}
	if err := g.sched.SetNice(l.PID, g.cfg.FallbackNice); err != nil {
		g.metrics.protectionErrors.WithLabelValues("nice").Inc()
		g.raise("sshd-nice-refused", "", alert.Critical, fmt.Sprintf("cannot renice sshd (pid %d): %v", l.PID, err), nil)
		return
	}
	g.log.Info("sshd listener reniced", "pid", l.PID, "nice", g.cfg.FallbackNice, "was", strconv.Itoa(attr.Nice))
}
