package guard

import (
	"context"
	"errors"
	"fmt"

	"labkeep/guardian/alert"
)

// ErrBusy is returned by Cleanup while another emergency action (memory
// kill, containment, hang kills, cleanup) runs.
var ErrBusy = errors.New("another emergency action is running")

// ErrNoWorkspace is returned by Cleanup while no workspace cgroup is
// guarded (the container has not started or is restarting).
var ErrNoWorkspace = errors.New("no workspace cgroup guarded")

// CleanupResult reports a cleanup.
type CleanupResult struct {
	Killed []int  // PIDs killed
	Failed int    // processes that could not be killed
	Note   string // why the cleanup may be incomplete
}

// Cleanup is the one-click recovery: it kills every unprotected process the
// same way fork-bomb containment does (freeze, SIGKILL, thaw, until none is
// left), small logins included. It returns ErrBusy at once while another emergency action runs.
func (g *Guardian) Cleanup(ctx context.Context) (CleanupResult, error) {
	if !g.emergency.TryLock() {
		return CleanupResult{}, ErrBusy
	}
	defer g.emergency.Unlock()
	if g.cg == nil {
		return CleanupResult{}, ErrNoWorkspace
	}
	res := g.containLocked(ctx, "cleanup", 0) // the user asked: their logins go too
	out := CleanupResult{Killed: res.killed}
	if !res.contained {
		out.Note = fmt.Sprintf("unprotected processes remained after %d rounds", res.rounds-1)
	}
	g.raise("cleanup", "", alert.Info, fmt.Sprintf("cleanup requested: killed %d unprotected processes", len(res.killed)), nil)
	return out, ctx.Err()
}
