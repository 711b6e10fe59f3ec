// Package guard runs guardian's watch loops over the workspace cgroup: it
// waits for the workspace container's cgroup (and for the new one after
// each restart), applies the kernel limits first, then protects sshd and
// the container's init, and keeps watching memory, process creation, CPU
// and SSH reachability, acting through the pure rules in package victim.
// All I/O goes through the small interfaces below, so the loops can run
// against the real kernel (guardian binary, end-to-end tests) or fakes.
// guard knows nothing of HTTP: package httpapi adapts it.
package guard

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"labkeep/guardian/alert"
	"labkeep/guardian/cgroupfs"
	"labkeep/guardian/killer"
	"labkeep/guardian/sched"
	"labkeep/guardian/victim"
)

// ProcessTable reads processes (package procfs implements it).
type ProcessTable interface {
	Snapshot(pids []int) ([]victim.Process, error)
	Process(pid int) (victim.Process, error)
	ListeningInodes(port int) (map[uint64]bool, error)
	SocketOwner(pids []int, inodes map[uint64]bool) (int, bool)
	OOMScoreAdj(pid int) (int, error)
	SetOOMScoreAdj(pid, adj int) error
	ExeFile(pid int) (victim.FileID, error)
	FileInRoot(pid int, path string) (victim.FileID, error)
}

// Killer signals processes after re-checking their identity (package
// killer implements it).
type Killer interface {
	Signal(id victim.Identity, sig unix.Signal) error
	Terminate(ctx context.Context, id victim.Identity, plan killer.Plan) (bool, error)
}

// Scheduler reads and sets CPU scheduling (sched.OS implements it).
type Scheduler interface {
	Get(pid int) (sched.Attr, error)
	SetRR(pid, prio int) error
	SetNice(pid, nice int) error
	SetOther(pid, nice int) error   // SCHED_OTHER at nice with reset-on-fork
	SetIdleProcess(pid int) error   // every thread SCHED_IDLE (CPU storms)
	SetNormalProcess(pid int) error // every thread back to SCHED_OTHER nice 0
}

// Prober checks SSH reachability (package sshprobe implements it).
type Prober interface {
	Probe(ctx context.Context) (banner string, took time.Duration, err error)
}

// Guardian protects one workspace cgroup.
type Guardian struct {
	cfg       Config
	cg        cgroupfs.Cgroup // the guarded cgroup; nil while none. Set by Attach and detach under emergency and mu, read freely by the loops, which run only in between
	workspace Workspace
	procs     ProcessTable
	killer    Killer
	sched     Scheduler
	probe     Prober
	alerts    *alert.Aggregator
	metrics   *Metrics
	log       *slog.Logger
	store     StateStore
	now       func() time.Time
	self      victim.Key
	cpus      float64 // capacity when the cgroup has no CPU quota

	emergency sync.Mutex // one emergency action at a time: memory kill, containment, hang kills, cleanup

	mu         sync.Mutex
	st         State
	listener   victim.Identity // the verified sshd listener only (see findListener)
	sshd       sshdState
	hadSSHD    bool
	sshOK      bool
	rtRefused  bool
	heartbeats map[string]time.Time
	// dying are the processes guardian is killing, since when: the CPU
	// storm leaves them at normal scheduling (see letDie).
	dying     map[victim.Key]time.Time
	crossedAt time.Time // when usage was first seen at the kill threshold
	// lastHigh is memory.events' high counter at the last look (v2);
	// highSeen once there was a look.
	lastHigh uint64
	highSeen bool
	// reserveSince is when a containment lifted pids.max by PidsReserve;
	// zero while pids.max is PidsMax (see releaseForks).
	reserveSince time.Time
	// forksHeld while a containment holds pids.max at 0, heldListener the
	// sshd listener it stopped meanwhile (see holdForks).
	forksHeld    bool
	heldListener victim.Identity

	limitsPending bool // the kernel limits could not be applied yet
	// ownWeightRefused while guardian's own CPU weight could not be set
	// (alerted once per streak, see keepOwnWeight).
	ownWeightRefused bool
	waiting          error // why no workspace cgroup is guarded, for Healthy
}

// Deps are the adapters a Guardian uses.
type Deps struct {
	Workspace Workspace
	Procs     ProcessTable
	Killer    Killer
	Scheduler Scheduler
	Prober    Prober
	Alerts    *alert.Aggregator
	Metrics   *Metrics
	Log       *slog.Logger
	State     StateStore       // nil: nothing survives a restart
	Now       func() time.Time // nil: time.Now
	// OnlineCPUs is the CPU capacity used when the cgroup has no quota;
	// 0: runtime.NumCPU().
	OnlineCPUs float64
}

// New validates cfg and builds a Guardian; it touches nothing yet.
func New(cfg Config, d Deps) (*Guardian, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("guardian config: %w", err)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.OnlineCPUs <= 0 {
		d.OnlineCPUs = float64(runtime.NumCPU())
	}
	g := &Guardian{cfg: cfg, workspace: d.Workspace, procs: d.Procs, killer: d.Killer, sched: d.Scheduler, probe: d.Prober,
		alerts: d.Alerts, metrics: d.Metrics, log: d.Log, store: d.State, now: d.Now, cpus: d.OnlineCPUs,
		sshOK: true, heartbeats: map[string]time.Time{}}
	g.st.Budget = victim.KillBudget{Max: cfg.KillMax, Window: cfg.KillWindow, Pause: cfg.KillPause}
	g.st.Hang = victim.HangTracker{Policy: cfg.Hang}
	if self, err := d.Procs.Process(os.Getpid()); err == nil {
		g.self = self.Key()
	}
	// Every new (not aggregated) alert is persisted at once, so a guardian
	// killed right after raising it still reports it after the restart.
	d.Alerts.OnRaise(func(alert.Alert) { g.saveLogged() })
	return g, nil
}
