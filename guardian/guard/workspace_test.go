package guard

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"labkeep/guardian/internal/poll"
)

func (c *fakeCgroup) snapshot() (frozen bool, setMemory int, pidsMax int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frozen, len(c.setMemory), c.pidsMax
}

// A guardian killed between freeze and thaw left the workspace frozen:
// attaching thaws it before anything else.
func TestAttachThawsAFrozenWorkspace(t *testing.T) {
	r := newStartedRig(t, testConfig(), func(r *rig) { r.cg.frozen = true })
	if err := r.g.Attach(context.Background(), r.cg); err != nil {
		t.Fatal(err)
	}
	if frozen, _, _ := r.cg.snapshot(); frozen {
		t.Error("the workspace is still frozen after attach")
	}
}

// Until the workspace container exists guardian is live but not healthy,
// and a cleanup has nothing to act on.
func TestNoWorkspaceYet(t *testing.T) {
	r := newStartedRig(t, testConfig(), func(*rig) {})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.g.Run(ctx) }()
	defer func() { cancel(); <-done }()
	poll.Eventually(t, 20*time.Second, func() (bool, string) { return r.g.Live() == nil, "guardian looked for the workspace" })
	if err := r.g.Healthy(); !errors.Is(err, ErrUnhealthy) {
		t.Errorf("Healthy() without a workspace = %v; want ErrUnhealthy", err)
	}
	if _, err := r.g.Cleanup(context.Background()); !errors.Is(err, ErrNoWorkspace) {
		t.Errorf("Cleanup() without a workspace = %v; want ErrNoWorkspace", err)
	}
	if _, n, _ := r.cg.snapshot(); n != 0 {
		t.Errorf("limits written %d times before the workspace existed", n)
	}
}

// guardian waits for the workspace container, guards it, notices when its
// cgroup has no process left (the container ended) and guards the new
// cgroup of the restarted container: thawed, limits re-applied.
func TestRunFollowsTheWorkspaceAcrossRestarts(t *testing.T) {
	cfg := testConfig()
	cfg.WatchEvery = time.Millisecond
	r := newStartedRig(t, cfg, func(*rig) {})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.g.Run(ctx) }()

	first := r.cg
	r.ws.set(first)
	poll.Eventually(t, 20*time.Second, func() (bool, string) { return r.g.Healthy() == nil, "the first cgroup guarded and healthy" })
	if _, n, pids := first.snapshot(); n != 1 || pids != cfg.PidsMax {
		t.Errorf("first cgroup: %d memory limit writes, pids.max %d; want 1 and %d", n, pids, cfg.PidsMax)
	}

	second := &fakeCgroup{table: r.procs, limit: 1024 * mib, usage: 500 * mib, frozen: true, name: "fake-restarted"}
	r.ws.set(second)
	first.mu.Lock()
	first.gone = true
	first.mu.Unlock()
	poll.Eventually(t, 20*time.Second, func() (bool, string) {
		_, n, _ := second.snapshot()
		return n == 1 && r.g.Healthy() == nil, "the restarted container's cgroup guarded and healthy"
	})
	if frozen, _, pids := second.snapshot(); frozen || pids != cfg.PidsMax {
		t.Errorf("restarted cgroup: frozen %v, pids.max %d; want thawed and %d", frozen, pids, cfg.PidsMax)
	}
	// The runtime writes the container's own limit after guardian's: the
	// watch puts guardian's back.
	second.mu.Lock()
	second.limit = 1024 * mib
	second.mu.Unlock()
	poll.Eventually(t, 20*time.Second, func() (bool, string) { _, n, _ := second.snapshot(); return n == 2, "guardian's limits re-asserted" })
	if !r.has("workspace-gone") {
		t.Errorf("alerts = %v; want workspace-gone", r.alertKinds())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run() = %v; want nil when stopped", err)
	}
}

// Without a memory limit from anywhere guardian cannot work: Run ends with
// ErrNoMemoryLimit instead of guarding blind.
func TestRunStopsWithoutAMemoryLimit(t *testing.T) {
	cfg := testConfig()
	cfg.MemoryLimit = 0
	r := newStartedRig(t, cfg, func(r *rig) { r.cg.limit = 0 })
	r.ws.set(r.cg)
	if err := r.g.Run(context.Background()); !errors.Is(err, ErrNoMemoryLimit) {
		t.Errorf("Run() = %v; want ErrNoMemoryLimit", err)
	}
}

// A cgroup that goes away while guardian attaches (the container restarts
// again at once) is not fatal: guardian looks again.
func TestRunRetriesAFailedAttach(t *testing.T) {
	cfg := testConfig()
	cfg.MemoryLimit = 0 // read from the cgroup, which fails at first
	cfg.WatchEvery = time.Millisecond
	r := newStartedRig(t, cfg, func(r *rig) { r.cg.limitErr = os.ErrNotExist })
	r.ws.set(r.cg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.g.Run(ctx) }()
	poll.Eventually(t, 20*time.Second, func() (bool, string) {
		r.ws.mu.Lock()
		defer r.ws.mu.Unlock()
		return r.ws.finds >= 2, "an attach attempt"
	})
	r.cg.mu.Lock()
	r.cg.limitErr = nil
	r.cg.mu.Unlock()
	poll.Eventually(t, 20*time.Second, func() (bool, string) { return r.g.Healthy() == nil, "the workspace guarded after the failed attach" })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run() = %v; want nil", err)
	}
}

// A workspace whose sshd listens only after guardian attached (a busy node
// starts it late) has its listener found at the next watch, not a whole
// protector period later: until then a containment would spare no login.
func TestListenerFoundSoonAfterAttach(t *testing.T) {
	cfg := testConfig()
	cfg.WatchEvery = time.Millisecond
	cfg.ProtectEvery = time.Hour
	r := newStartedRig(t, cfg, func(r *rig) { r.procs.listener = 0 })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.g.Run(ctx) }()
	defer func() { cancel(); <-done }()
	r.ws.set(r.cg)
	poll.Eventually(t, 20*time.Second, func() (bool, string) {
		return r.g.Live() == nil && r.has("sshd-not-found"), "guarding, no listener yet"
	})
	r.procs.mu.Lock()
	r.procs.listener = 20 // sshd listens now
	r.procs.mu.Unlock()
	poll.Eventually(t, 20*time.Second, func() (bool, string) { return r.g.listenerKnown(), "the listener is not known" })
}
