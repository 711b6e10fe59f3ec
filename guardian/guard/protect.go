package guard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

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

// protectLoop runs the protector every ProtectEvery, and at every watch
// (WatchEvery) while it knows no verified sshd listener: guardian may
// attach to the workspace before its sshd listens (a busy node starts it
// late; seen on the v1 node beside two busy loops), and until the
// protector finds the listener, sshd has no real-time scheduling and a
// containment spares no login (it protects the listener's connections
// only). Waiting a whole period lost five logins to two fork bombs there.
func (g *Guardian) protectLoop(ctx context.Context) {
	t := time.NewTicker(min(g.cfg.WatchEvery, g.cfg.ProtectEvery))
	defer t.Stop()
	var last time.Time
	for {
		if last.IsZero() || time.Since(last) >= g.cfg.ProtectEvery || !g.listenerKnown() {
			g.protect(ctx)
			last = time.Now()
		}
		g.beat("protect")
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// listenerKnown reports whether the protector has verified an sshd
// listener in the guarded cgroup.
func (g *Guardian) listenerKnown() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.listener.PID != 0
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
	// but answers nothing; a stopped init freezes the container. The
	// listener a containment stopped while it holds forks is its own to
	// continue (holdForks).
	g.mu.Lock()
	held := g.heldListener
	g.mu.Unlock()
	for _, p := range procs {
		reason, ok := prot[p.Key()]
		if !ok || reason == victim.ReasonSelf || p.State != "T" || p.Key() == held.Key() {
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
	var inherited []int // unprotected processes given back oom_score_adj 0
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
			if g.setOOM(p, want) {
				inherited = append(inherited, p.PID)
			}
			continue
		}
		if g.setOOM(p, want) {
			g.log.Info("oom_score_adj set", "pid", p.PID, "exe", p.Exe, "from", cur, "to", want)
		}
	}
	if len(inherited) > 0 {
		// One line per pass: every process of a bomb started from a login
		// shell inherits sshd's -1000, and one line each would flood the
		// log while guardian contains it.
		g.log.Info("oom_score_adj 0 given back to processes that inherited a protected one",
			"processes", len(inherited), "pids", inherited[:min(len(inherited), 10)])
	}
	if self, err := g.procs.OOMScoreAdj(os.Getpid()); err == nil && self != oomSelf && g.setOOM(victim.Process{Identity: victim.Identity{PID: os.Getpid()}}, oomSelf) {
		g.log.Info("oom_score_adj set", "pid", os.Getpid(), "exe", "guardian", "from", self, "to", oomSelf)
	}
}

// setOOM sets p's oom_score_adj to want and reports whether it did; a
// refusal is counted, logged, and alerted when it lacks the capability.
func (g *Guardian) setOOM(p victim.Process, want int) bool {
	err := g.procs.SetOOMScoreAdj(p.PID, want)
	if err == nil {
		return true
	}
	g.metrics.protectionErrors.WithLabelValues("oom_score_adj").Inc()
	if errors.Is(err, os.ErrPermission) {
		g.raise("oom-protection-unavailable", "", alert.Warning,
			fmt.Sprintf("cannot set oom_score_adj %d (needs CAP_SYS_RESOURCE): %v", want, err), nil)
		return false
	}
	g.log.Warn("set oom_score_adj", "pid", p.PID, "want", want, "err", err)
	return false
}

// sshdState is what guardian knows of the workspace's sshd in the guarded
// cgroup. Attach and detach reset it: a restarted container is a new
// cgroup with a fresh root filesystem, whose sshd is learnt again.
type sshdState struct {
	trust victim.SSHDTrust
	// sessionFiles are the session executables (Config.SessionExes) as
	// found in the verified listener's root when it was first verified;
	// with trust.Want they are the only files a protected session may run.
	sessionFiles map[victim.FileID]bool
	raised       map[victim.Key]raisedProc // processes guardian gave real-time scheduling or the fallback nice
	demoted      map[victim.Key]bool       // processes that lost real-time for using too much CPU: never raised again
}

// raisedProc is a process guardian raised, with the CPU time it had used
// at the last policing sample.
type raisedProc struct {
	id      victim.Identity
	rt      bool
	ticks   uint64
	sampled time.Time // zero: no sample yet
	// overSince is the start of the first of the unbroken run of samples
	// over the real-time CPU share that ends at the last one; zero when
	// the last sample was within it.
	overSince time.Time
}

// findListener identifies the sshd listener: the process holding the SSH
// listening socket, provided it runs the workspace's sshd executable
// (victim.CheckListener). Holding the port alone earns nothing: a process
// that holds it and fails the check raises an alert, loses whatever
// scheduling guardian gave it, and is not g.listener, so the protected
// set leaves it out. The cached listener is kept while it still holds the
// socket and passes the check; otherwise every process in the cgroup is
// searched. A listener that disappears raises an alert.
func (g *Guardian) findListener(pids []int) {
	inodes, err := g.procs.ListeningInodes(g.cfg.SSHPort)
	if err != nil {
		g.log.Error("read listening sockets", "err", err)
		return
	}
	g.mu.Lock()
	cached := g.listener
	g.mu.Unlock()
	var holder victim.Process
	if cached.PID != 0 {
		if pid, ok := g.procs.SocketOwner([]int{cached.PID}, inodes); ok {
			if p, err := g.procs.Process(pid); err == nil && p.Identity == cached {
				holder = p
			}
		}
	}
	if holder.PID == 0 {
		if pid, ok := g.procs.SocketOwner(pids, inodes); ok {
			if p, err := g.procs.Process(pid); err == nil {
				holder = p
			}
		}
	}
	var found victim.Identity
	impostor := false
	if holder.PID != 0 {
		if g.verifyListener(holder, pids) {
			found = holder.Identity
		} else {
			impostor = true
		}
	}
	g.mu.Lock()
	had := g.hadSSHD
	g.listener = found
	if found.PID != 0 {
		g.hadSSHD = true
	}
	g.mu.Unlock()
	g.demoteOthers(found)
	switch {
	case found.PID == 0 && had:
		g.raise("sshd-gone", "", alert.Critical, fmt.Sprintf("the SSH listener on port %d is gone from the workspace (was %v)", g.cfg.SSHPort, cached), nil)
		g.mu.Lock()
		g.hadSSHD = false
		g.mu.Unlock()
	case found.PID == 0 && !impostor:
		g.raise("sshd-not-found", "", alert.Warning, fmt.Sprintf("no process in the workspace listens on port %d", g.cfg.SSHPort), nil)
	case found != cached && found.PID != 0:
		g.log.Info("sshd listener", "pid", found.PID, "exe", found.Exe, "start", found.StartTime)
	}
}

// verifyListener reports whether the socket holder p runs the
// workspace's sshd executable, recording it when it is the first listener
// of the cgroup; it alerts, naming p, when it does not.
func (g *Guardian) verifyListener(p victim.Process, pids []int) bool {
	file, err := g.procs.ExeFile(p.PID)
	if err != nil {
		g.log.Warn("identify the listener's executable", "pid", p.PID, "err", err)
	}
	exe := victim.Executable{Path: p.Exe, File: file}
	trust := g.sshdTrust(pids)
	v := victim.CheckListener(exe, trust)
	if v.Record {
		g.mu.Lock()
		g.sshd.trust.Want = exe
		g.mu.Unlock()
		g.log.Info("sshd executable recorded", "pid", p.PID, "exe", exe.Path, "file", exe.File.String())
	}
	if v.Qualifies {
		g.learnSessionFiles(p.PID)
	}
	if !v.Qualifies {
		g.raise("listener-not-sshd", strconv.Itoa(p.PID), alert.Critical,
			fmt.Sprintf("pid %d (%s) holds the SSH port %d but is not the workspace's sshd: %s; it gets no protection", p.PID, exe.Path, g.cfg.SSHPort, v.Why),
			map[string]string{"pid": strconv.Itoa(p.PID), "exe": exe.Path, "why": v.Why})
	}
	return v.Qualifies
}

// learnSessionFiles resolves, once per cgroup, the session executables in
// the root of the verified listener pid; a path that does not exist there
// (OpenSSH before 9.8 has no sshd-session) is left out.
func (g *Guardian) learnSessionFiles(pid int) {
	g.mu.Lock()
	known := g.sshd.sessionFiles != nil
	g.mu.Unlock()
	if known {
		return
	}
	files := map[victim.FileID]bool{}
	for _, path := range g.cfg.SessionExes {
		if f, err := g.procs.FileInRoot(pid, path); err == nil && f.Known() {
			files[f] = true
		}
	}
	g.mu.Lock()
	g.sshd.sessionFiles = files
	g.mu.Unlock()
}

// dropUnverifiedSessions removes from prot every sshd session process
// that does not run the workspace's sshd file or one of its session
// executables, and alerts naming it. sshd re-executes its binary for every
// connection: without this, root could replace the binary, connect, and
// get a process immune to kills (and holding the listener's inherited
// oom_score_adj -1000) under the verified listener.
func (g *Guardian) dropUnverifiedSessions(procs []victim.Process, prot victim.Protected) {
	g.mu.Lock()
	want, sessionFiles := g.sshd.trust.Want.File, g.sshd.sessionFiles
	g.mu.Unlock()
	for _, p := range procs {
		if prot[p.Key()] != victim.ReasonSession {
			continue
		}
		f, err := g.procs.ExeFile(p.PID)
		if err == nil && f.Known() && (f == want || sessionFiles[f]) {
			continue
		}
		delete(prot, p.Key())
		if errors.Is(err, victim.ErrGone) {
			continue // exited since the snapshot: nothing to protect or report
		}
		runs := f.String()
		if err != nil {
			runs = fmt.Sprintf("an executable guardian cannot identify (%v)", err)
		}
		g.raise("session-not-sshd", strconv.Itoa(p.PID), alert.Critical,
			fmt.Sprintf("pid %d (%s), started by the sshd listener, runs %s, not the workspace's sshd: it gets no protection", p.PID, p.Exe, runs),
			map[string]string{"pid": strconv.Itoa(p.PID), "exe": p.Exe})
	}
}

// sshdTrust returns what a listener is checked against. A configured
// executable is resolved once per cgroup, in the root of the container's
// init (its oldest process, whose root the user cannot change after the
// fact, unlike the listener's own), and then kept: replacing the file
// later gives a new inode, which does not qualify.
func (g *Guardian) sshdTrust(pids []int) victim.SSHDTrust {
	g.mu.Lock()
	trust := g.sshd.trust
	g.mu.Unlock()
	if g.cfg.SSHDExe == "" || trust.Want.File.Known() {
		return trust
	}
	trust = victim.SSHDTrust{Want: victim.Executable{Path: g.cfg.SSHDExe}, Configured: true}
	procs, err := g.procs.Snapshot(pids)
	if err != nil || len(procs) == 0 {
		return trust
	}
	init := procs[0]
	for _, p := range procs[1:] {
		if p.StartTime < init.StartTime || (p.StartTime == init.StartTime && p.PID < init.PID) {
			init = p
		}
	}
	file, err := g.procs.FileInRoot(init.PID, g.cfg.SSHDExe)
	if err != nil {
		g.log.Warn("resolve the configured sshd executable", "path", g.cfg.SSHDExe, "root_of", init.PID, "err", err)
		return trust
	}
	trust.Want.File = file
	g.mu.Lock()
	g.sshd.trust = trust
	g.mu.Unlock()
	g.log.Info("sshd executable resolved", "path", g.cfg.SSHDExe, "file", file.String(), "root_of", init.PID)
	return trust
}

// demoteOthers takes every process guardian raised, other than the
// verified listener l, back to SCHED_OTHER at nice 0: a listener that
// re-executed another file, or that no longer holds the socket, keeps no
// priority it got as sshd (both survive exec).
func (g *Guardian) demoteOthers(l victim.Identity) {
	g.mu.Lock()
	var stale []raisedProc
	for k, r := range g.sshd.raised {
		if k != l.Key() {
			stale = append(stale, r)
			delete(g.sshd.raised, k)
		}
	}
	g.mu.Unlock()
	for _, r := range stale {
		if p, err := g.procs.Process(r.id.PID); err != nil || p.Key() != r.id.Key() {
			continue
		}
		if err := g.sched.SetOther(r.id.PID, 0); err != nil {
			g.log.Warn("demote a process that is no longer the sshd listener", "pid", r.id.PID, "err", err)
			continue
		}
		g.log.Info("demoted a process that is no longer the sshd listener", "pid", r.id.PID, "exe", r.id.Exe)
	}
}

// track records that guardian raised l (rt: real-time, else the nice
// fallback), for the police and for demoteOthers.
func (g *Guardian) track(l victim.Identity, rt bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sshd.raised == nil {
		g.sshd.raised = map[victim.Key]raisedProc{}
	}
	r, ok := g.sshd.raised[l.Key()]
	if ok && r.rt == rt {
		return
	}
	g.sshd.raised[l.Key()] = raisedProc{id: l, rt: rt}
}

// protectScheduling keeps the listener at SCHED_RR|SCHED_RESET_ON_FORK,
// or at the fallback nice value (with reset-on-fork, so the shells and
// jobs it forks start at nice 0) where real-time is refused or disabled
// (RTPriority 0). A listener demoted for using too much CPU under
// real-time gets neither again.
func (g *Guardian) protectScheduling(l victim.Identity, rtRefused bool) {
	g.mu.Lock()
	demoted := g.sshd.demoted[l.Key()]
	g.mu.Unlock()
	if demoted {
		return
	}
	attr, err := g.sched.Get(l.PID)
	if err != nil {
		return
	}
	if g.cfg.RTPriority > 0 && attr.IsRR(g.cfg.RTPriority) {
		g.track(l, true)
		return
	}
	if g.cfg.RTPriority > 0 && !rtRefused {
		err := g.sched.SetRR(l.PID, g.cfg.RTPriority)
		if err == nil {
			g.track(l, true)
			g.log.Info("sshd listener set to SCHED_RR", "pid", l.PID, "priority", g.cfg.RTPriority, "was_policy", attr.Policy)
			return
		}
		g.metrics.protectionErrors.WithLabelValues("sched_rr").Inc()
		g.raise("sshd-rt-refused", "", alert.Warning,
			fmt.Sprintf("SCHED_RR refused for sshd (pid %d): %v; falling back to nice %d", l.PID, err, g.cfg.FallbackNice), nil)
	}
	g.track(l, false)
	if attr.Policy == unix.SCHED_NORMAL && attr.Nice == g.cfg.FallbackNice && attr.ResetOnFork {
		return
	}
	if err := g.sched.SetOther(l.PID, g.cfg.FallbackNice); err != nil {
		g.metrics.protectionErrors.WithLabelValues("nice").Inc()
		g.raise("sshd-nice-refused", "", alert.Critical, fmt.Sprintf("cannot renice sshd (pid %d): %v", l.PID, err), nil)
		return
	}
	g.log.Info("sshd listener reniced", "pid", l.PID, "nice", g.cfg.FallbackNice, "was", strconv.Itoa(attr.Nice))
}
