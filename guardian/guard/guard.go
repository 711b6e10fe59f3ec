// Package guard runs guardian's watch loops over the workspace cgroup: it
// applies the kernel limits first, then protects sshd and the container's
// init, and keeps watching memory, process creation, CPU and SSH
// reachability, acting through the pure rules in package victim. All I/O
// goes through the small interfaces below, so the loops can run against the
// real kernel (guardian binary, end-to-end tests) or fakes.
package guard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"labkeep/guardian/alert"
	"labkeep/guardian/cgroupfs"
	"labkeep/guardian/httpapi"
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
}

// Prober checks SSH reachability (package sshprobe implements it).
type Prober interface {
	Probe(ctx context.Context) (banner string, took time.Duration, err error)
}

// Config holds every tunable; defaults are in Defaults.
type Config struct {
	MemoryLimit   uint64  // M in bytes; 0: take it from saved state or the cgroup's current hard limit
	HighFraction  float64 // memory.high = HighFraction·M
	MaxFraction   float64 // memory.max = MaxFraction·M
	AlertFraction float64 // alert at AlertFraction·M
	KillFraction  float64 // kill the largest unprotected process at KillFraction·M
	HandleOOM     bool    // v1: disable the kernel OOM killer so guardian picks the victim; v2: memory.oom.group=0
	MemoryPoll    time.Duration

	PidsMax       int
	ForkThreshold int
	ForkWindow    time.Duration
	ForkScan      time.Duration
	FreezeTimeout time.Duration
	ContainRounds int

	ProtectEvery time.Duration
	SSHPort      int
	SessionExes  []string
	ProtectExes  []string
	ProtectPID1  bool
	ProtectInit  bool
	RTPriority   int
	RTRuntimeUS  int
	FallbackNice int

	KillGrace  time.Duration
	KillWait   time.Duration
	KillMax    int
	KillWindow time.Duration
	KillPause  time.Duration

	CPUEvery   time.Duration
	Hang       victim.HangPolicy
	OnlineCPUs float64 // capacity when the cgroup has no CPU quota

	ProbeEvery time.Duration

	StatePath string // where state survives a restart; empty: not persisted
}

// Defaults returns the numbers.
func Defaults() Config {
	return Config{
		HighFraction: 0.90, MaxFraction: 0.98, AlertFraction: 0.95, KillFraction: 0.97,
		HandleOOM: true, MemoryPoll: 2 * time.Second,
		PidsMax: 4096, ForkThreshold: 500, ForkWindow: 10 * time.Second, ForkScan: time.Second,
		FreezeTimeout: 2 * time.Second, ContainRounds: 20,
		ProtectEvery: 30 * time.Second, SSHPort: 22, ProtectPID1: true, ProtectInit: true,
		RTPriority: 1, RTRuntimeUS: 10000, FallbackNice: -20,
		KillGrace: 5 * time.Second, KillWait: 5 * time.Second,
		KillMax: 3, KillWindow: 30 * time.Second, KillPause: 60 * time.Second,
		CPUEvery:   5 * time.Second,
		Hang:       victim.HangPolicy{CPUFraction: 0.95, AlertAfter: 30 * time.Second, KillOne: 90 * time.Second, KillThree: 180 * time.Second, KillAll: 300 * time.Second},
		ProbeEvery: 30 * time.Second,
	}
}

// Validate reports a configuration that cannot work, before anything is
// touched.
func (c Config) Validate() error {
	var errs []error
	frac := func(name string, v float64) {
		if v <= 0 || v > 1 {
			errs = append(errs, fmt.Errorf("%s must be in (0,1], got %v", name, v))
		}
	}
	frac("high fraction", c.HighFraction)
	frac("max fraction", c.MaxFraction)
	frac("alert fraction", c.AlertFraction)
	frac("kill fraction", c.KillFraction)
	frac("hang CPU fraction", c.Hang.CPUFraction)
	if c.HighFraction > c.MaxFraction || c.KillFraction > c.MaxFraction {
		errs = append(errs, fmt.Errorf("high (%v) and kill (%v) fractions must not exceed the max fraction (%v)", c.HighFraction, c.KillFraction, c.MaxFraction))
	}
	if c.PidsMax <= 0 || c.ForkThreshold <= 0 || c.ContainRounds <= 0 || c.KillMax <= 0 {
		errs = append(errs, errors.New("pids max, fork threshold, contain rounds and kill max must be positive"))
	}
	for name, d := range map[string]time.Duration{"memory poll": c.MemoryPoll, "fork window": c.ForkWindow, "fork scan": c.ForkScan,
		"freeze timeout": c.FreezeTimeout, "protect interval": c.ProtectEvery, "kill wait": c.KillWait, "kill window": c.KillWindow,
		"CPU interval": c.CPUEvery, "probe interval": c.ProbeEvery} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", name, d))
		}
	}
	if c.SSHPort <= 0 || c.SSHPort > 65535 {
		errs = append(errs, fmt.Errorf("SSH port %d out of range", c.SSHPort))
	}
	return errors.Join(errs...)
}

// State is what guardian persists so a restarted guardian takes up where
// the previous one stopped: the limit M it derived, the kill history (the
// kill-loop pause must survive a restart), the hang escalation and the
// recent alerts.
type State struct {
	MemoryLimit uint64             `json:"memory_limit"`
	Budget      victim.KillBudget  `json:"kill_budget"`
	Hang        victim.HangTracker `json:"hang"`
	Alerts      []alert.Alert      `json:"alerts"`
	LastOOMKill uint64             `json:"last_oom_kill"`
	Kills       int                `json:"kills"`
	Bombs       int                `json:"bombs"`
	Starts      int                `json:"starts"`
}

// Guardian protects one workspace cgroup.
type Guardian struct {
	cfg     Config
	cg      cgroupfs.Cgroup
	procs   ProcessTable
	killer  Killer
	sched   Scheduler
	probe   Prober
	alerts  *alert.Aggregator
	metrics *Metrics
	log     *slog.Logger
	now     func() time.Time
	self    victim.Key

	emergency sync.Mutex // one emergency action at a time: memory kill, containment, hang kills, cleanup

	mu         sync.Mutex
	st         State
	listener   victim.Identity
	hadSSHD    bool
	sshOK      bool
	rtRefused  bool
	heartbeats map[string]time.Time
	crossedAt  time.Time // when usage was first seen at the kill threshold

	limitsPending bool // the kernel limits could not be applied yet
}

// Deps are the adapters a Guardian uses.
type Deps struct {
	Cgroup    cgroupfs.Cgroup
	Procs     ProcessTable
	Killer    Killer
	Scheduler Scheduler
	Prober    Prober
	Alerts    *alert.Aggregator
	Metrics   *Metrics
	Log       *slog.Logger
	Now       func() time.Time
}

// New validates cfg and builds a Guardian; it touches nothing yet.
func New(cfg Config, d Deps) (*Guardian, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("guardian config: %w", err)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	g := &Guardian{cfg: cfg, cg: d.Cgroup, procs: d.Procs, killer: d.Killer, sched: d.Scheduler, probe: d.Prober,
		alerts: d.Alerts, metrics: d.Metrics, log: d.Log, now: d.Now, sshOK: true, heartbeats: map[string]time.Time{}}
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

// Start loads saved state, applies the kernel settings (limits first: they
// stay when guardian is killed) and protects processes once. An error here
// means guardian cannot protect the workspace and should exit non-zero.
func (g *Guardian) Start(ctx context.Context) error {
	if err := g.load(); err != nil {
		return err
	}
	g.mu.Lock()
	g.st.Starts++
	restarted := g.st.Starts > 1
	m := g.cfg.MemoryLimit
	if m == 0 {
		m = g.st.MemoryLimit
	}
	g.mu.Unlock()
	if m == 0 {
		cur, err := g.cg.MemoryLimit()
		if err != nil {
			return fmt.Errorf("read memory limit: %w", err)
		}
		if cur == 0 {
			return errors.New("the workspace cgroup has no memory limit and none is configured (GUARDIAN_MEMORY_LIMIT)")
		}
		m = cur
	}
	g.mu.Lock()
	g.st.MemoryLimit = m
	g.mu.Unlock()
	g.alerts.Restore(g.st.Alerts)

	if err := g.applyLimits(); err != nil {
		// Not fatal: a guardian that exits protects nothing. The protector
		// retries, and the memory loop can free memory meanwhile (setting a
		// limit below current usage fails with EBUSY).
		g.raise("limits-not-applied", "", alert.Critical, fmt.Sprintf("kernel limits not applied yet, retrying: %v", err), nil)
	}
	if g.cfg.HandleOOM {
		if err := g.cg.HandleOOM(); err != nil {
			g.raise("oom-handling-unavailable", "", alert.Warning, fmt.Sprintf("cannot take over OOM handling: %v", err), nil)
		}
	}
	if err := g.cg.GrantRT(g.cfg.RTRuntimeUS); err != nil {
		g.mu.Lock()
		g.rtRefused = true
		g.mu.Unlock()
		g.raise("sshd-rt-unavailable", "", alert.Warning,
			fmt.Sprintf("no real-time budget for the workspace cgroup (%v); sshd gets nice %d instead of SCHED_RR", err, g.cfg.FallbackNice), nil)
	}
	g.metrics.memoryLimit.Set(float64(m))
	g.log.Info("started", "cgroup", g.cg.String(), "memory_limit", m, "restarted", restarted, "starts", g.st.Starts)
	g.protect(ctx)
	return g.save()
}

// applyLimits sets memory.high/max and pids.max unless they already have
// the wanted values (a restarted guardian finds its own settings). It
// records whether they are in place, for the protector to retry.
func (g *Guardian) applyLimits() error {
	m := g.memLimit()
	high, max := uint64(g.cfg.HighFraction*float64(m)), uint64(g.cfg.MaxFraction*float64(m))
	var errs []error
	// The kernel rounds limits down to whole pages.
	if cur, err := g.cg.MemoryLimit(); err != nil || cur != max/pageSize*pageSize {
		if err := g.cg.SetMemory(high, max); err != nil {
			errs = append(errs, fmt.Errorf("memory limits: %w", err))
		}
	}
	if cur, err := g.cg.PidsLimit(); err != nil || cur != g.cfg.PidsMax {
		if err := g.cg.SetPidsMax(g.cfg.PidsMax); err != nil {
			errs = append(errs, fmt.Errorf("pids.max: %w", err))
		}
	}
	err := errors.Join(errs...)
	g.mu.Lock()
	g.limitsPending = err != nil
	g.mu.Unlock()
	if err == nil {
		g.log.Info("limits applied", "cgroup", g.cg.String(), "memory_limit", m, "memory_high", high, "memory_max", max, "pids_max", g.cfg.PidsMax)
	}
	return err
}

var pageSize = uint64(os.Getpagesize())

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

// Healthy implements httpapi.Backend: every loop must have run within
// three of its periods (emergency actions may hold a loop for a while).
func (g *Guardian) Healthy() error {
	periods := map[string]time.Duration{"protect": g.cfg.ProtectEvery, "memory": g.cfg.MemoryPoll, "fork": g.cfg.ForkScan, "cpu": g.cfg.CPUEvery, "probe": g.cfg.ProbeEvery}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	for name, p := range periods {
		last, ok := g.heartbeats[name]
		limit := 3*p + g.cfg.KillGrace + g.cfg.KillWait + g.cfg.FreezeTimeout
		if !ok || now.Sub(last) > limit {
			return fmt.Errorf("%s loop last ran %v ago: %w", name, now.Sub(last).Round(time.Millisecond), httpapi.ErrUnhealthy)
		}
	}
	return nil
}

// Alerts implements httpapi.Backend.
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

func (g *Guardian) load() error {
	if g.cfg.StatePath == "" {
		return nil
	}
	b, err := os.ReadFile(g.cfg.StatePath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		// A torn or foreign file must not stop protection: start afresh.
		g.log.Error("state file unreadable, starting afresh", "path", g.cfg.StatePath, "err", err)
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	st.Budget.Max, st.Budget.Window, st.Budget.Pause = g.cfg.KillMax, g.cfg.KillWindow, g.cfg.KillPause
	st.Hang.Policy = g.cfg.Hang
	g.st = st
	return nil
}

// save writes the state atomically (temporary file, then rename).
func (g *Guardian) save() error {
	if g.cfg.StatePath == "" {
		return nil
	}
	g.mu.Lock()
	g.st.Alerts = g.alerts.Recent()
	b, err := json.MarshalIndent(g.st, "", "  ")
	g.mu.Unlock()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(g.cfg.StatePath), ".guardian-state-*")
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("save state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), g.cfg.StatePath)
}

func (g *Guardian) saveLogged() {
	if err := g.save(); err != nil {
		g.log.Error("save state", "err", err)
	}
}
