package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"labkeep/guardian/alert"
	"labkeep/guardian/killer"
)

// ListenAPI binds addr (host:port) for guardian's API and returns the
// listener. Root in the workspace shares the Pod's network namespace: with
// guardian down (killed, restarting) it can bind guardian's port, and
// guardian would come back unable to serve /healthz and /cleanup. So while
// the port is taken (EADDRINUSE) ListenAPI takes it back: every process of
// the guarded workspace cgroup holding a listening socket on the port is
// killed (such a process earns no protection, whatever it is, save the
// verified sshd listener, which is only alerted), an alert names it, and
// the bind is retried after ListenRetry, doubling up to ListenRetryMax,
// until it succeeds or ctx ends. A holder outside the workspace cgroup is
// never touched: guardian alerts and keeps retrying. Nor is anything
// killed before the workspace cgroup is known (guardian may start before
// the workspace exists). Until the bind succeeds the API, /livez included,
// does not answer, so the start-up probe fails, as it should. Any other
// error of the bind (a malformed address) is returned at once.
func (g *Guardian) ListenAPI(ctx context.Context, addr string) (net.Listener, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return nil, fmt.Errorf("port %q: %w", p, err)
	}
	wait := g.cfg.ListenRetry
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, err
		}
		if err := g.reclaimPort(ctx, port); err != nil {
			g.log.Warn("API port taken", "port", port, "retry_in", wait, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, g.cfg.ListenRetryMax)
	}
}

// errPortHolderUnknown: the port is taken, and no process of the
// workspace could be killed for it.
var errPortHolderUnknown = errors.New("no process of the workspace killed for it")

// reclaimPort kills the workspace's processes listening on port (see
// ListenAPI). It runs as an emergency action: one at a time with the
// other kills, and never while the guarded cgroup changes.
func (g *Guardian) reclaimPort(ctx context.Context, port int) error {
	g.emergency.Lock()
	defer g.emergency.Unlock()
	g.mu.Lock()
	cg, listener := g.cg, g.listener
	g.mu.Unlock()
	if cg == nil {
		return ErrNoWorkspace
	}
	inodes, err := g.procs.ListeningInodes(port)
	if err != nil {
		return err
	}
	pids, err := cg.Procs()
	if err != nil {
		return err
	}
	killed := 0
	// SocketOwner returns the first holder in pids' order; go on after it
	// to find every holder (forked children share the socket).
	for rest := pids; ; {
		pid, ok := g.procs.SocketOwner(rest, inodes)
		if !ok {
			break
		}
		for i, p := range rest {
			if p == pid {
				rest = rest[i+1:]
				break
			}
		}
		proc, err := g.procs.Process(pid)
		if err != nil {
			continue
		}
		fields := map[string]string{"pid": strconv.Itoa(proc.PID), "exe": proc.Exe, "comm": proc.Comm, "port": strconv.Itoa(port)}
		if listener.PID != 0 && proc.Identity == listener {
			g.raise("api-port-sshd", "", alert.Critical,
				fmt.Sprintf("the workspace's sshd listener (PID %d) holds guardian's API port %d; it is not killed", proc.PID, port), fields)
			continue
		}
		g.letDie(proc.Identity)
		if _, err := g.killer.Terminate(ctx, proc.Identity, killer.Plan{Grace: g.cfg.KillGrace, KillWait: g.cfg.KillWait}); err != nil {
			g.log.Warn("API port holder not killed", "pid", proc.PID, "exe", proc.Exe, "err", err)
			continue
		}
		killed++
		g.metrics.kills.WithLabelValues("api-port").Inc()
		g.raise("api-port-taken", "", alert.Critical,
			fmt.Sprintf("process %d (%s) of the workspace held guardian's API port %d and was killed", proc.PID, proc.Exe, port), fields)
	}
	if killed == 0 {
		g.raise("api-port-held", "", alert.Warning,
			fmt.Sprintf("guardian's API port %d is taken and no process of the workspace could be killed for it; guardian keeps trying to bind it", port),
			map[string]string{"port": strconv.Itoa(port)})
		return errPortHolderUnknown
	}
	return nil
}
