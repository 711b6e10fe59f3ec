package guard

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"labkeep/guardian/victim"
)

// Config holds every tunable of the loops. Defaults returns the values
// guardian runs with unless told otherwise; Validate rejects a combination
// that cannot work before anything is touched.
type Config struct {
	MemoryLimit   uint64  // M in bytes; 0: take it from saved state or the cgroup's current hard limit
	HighFraction  float64 // memory.high = HighFraction·M
	MaxFraction   float64 // memory.max = MaxFraction·M
	AlertFraction float64 // alert at AlertFraction·M
	KillFraction  float64 // kill the largest unprotected process at KillFraction·M
	// HeldStall (v2): over memory.high, throttled and stalled on memory
	// this share of the last 10 s, the workspace is held there and a kill
	// is due (victim.MemoryPolicy.HeldAtHigh); 0 turns it off.
	HeldStall  float64
	HandleOOM  bool // v1: disable the kernel OOM killer so guardian picks the victim; v2: memory.oom.group=0
	MemoryPoll time.Duration

	PidsMax int
	// A fork bomb (victim.BombPolicy) is ForkThreshold forks refused at
	// pids.max within ForkWindow, or processes at ForkGrowthFraction of
	// PidsMax or more that grow fast enough to reach it within ForkHorizon
	// or of which ForkBranchFraction fork two or more of the others.
	// ForkScan is how often the pids accounting is read (three small
	// files; it bounds the reaction on cgroup v1, which sends no events).
	ForkThreshold      int
	ForkWindow         time.Duration
	ForkScan           time.Duration
	ForkGrowthFraction float64
	ForkHorizon        time.Duration
	ForkBranchFraction float64
	// PidsReserve is added to pids.max while a containment finds the
	// frozen workspace within it of the limit, until the killed processes
	// are reaped, so sshd can fork for the logins that queued meanwhile.
	PidsReserve   int
	FreezeTimeout time.Duration
	// HoldForksAfter is how long a containment's first freeze may take
	// before guardian holds every fork (pids.max 0) for the rest of that
	// round. A freeze that completes stops the bomb by itself, and a hold
	// from the start would refuse the forks sshd makes for a login while
	// the freeze spreads (seen in CI: two logins refused in the same
	// instant); a freeze that drags on, as on the emulated v2 node, would
	// let the bomb fork on while guardian kills. 0: hold from the start.
	HoldForksAfter time.Duration
	ContainRounds  int
	// SpareLoginMax: a fork-bomb containment spares login subtrees (a
	// login shell under an sshd session, with its descendants) of at most
	// this many processes, so a login in progress beside the bomb
	// survives it (victim.SpareSmallLogins); 0 spares none.
	SpareLoginMax int
	// OwnCPUWeight is guardian's own container's CPU weight against its
	// siblings in the Pod (cgroup v2 units, 1 to 10000; v1 cpu.shares
	// converted as the kubelet converts them; 0 leaves the runtime's).
	// The kubelet derives it from guardian's CPU request (100m: weight 4,
	// beside the workspace's 39 for 1 CPU), so in an emergency the
	// thousands of runnable processes of a bomb would take ten times
	// guardian's share of the Pod's CPU, and a node busy outside the Pod
	// leaves the Pod little to share. Guardian idles but for emergencies,
	// so the workspace loses nothing while it does; its CPU limit still
	// bounds what it takes; the Pod's weight against other Pods is the
	// kubelet's and unchanged.
	OwnCPUWeight int

	ProtectEvery time.Duration
	SSHPort      int
	SessionExes  []string // executables sshd runs per connection (protected as the listener's children)
	ProtectExes  []string
	ProtectPID1  bool
	ProtectInit  bool
	RTPriority   int
	// RTRuntimeUS is the real-time budget per period (1 s) the workspace
	// cgroup gets on v1 with RT group scheduling; a listener past it waits
	// for the next period. 50 ms, the RT police's 5 % of a CPU: at 10 ms a
	// listener forking for a login every few hundred ms ran out, and under
	// a CPU storm logins took up to 0.8 s (p99; 0.17–0.23 s at 50 ms).
	// Each workspace takes it from the node's budget (950 ms by default):
	// one the node cannot grant gets the nice fallback, with an alert.
	RTRuntimeUS  int
	FallbackNice int
	// SSHDExe is the sshd executable's path inside the container (resolved
	// in the container's root when the listener is first checked); "": the
	// executable of the first listener found in the guarded cgroup. Only a
	// listener running that very file (device and inode) is protected.
	SSHDExe string
	// RTMaxCPUShare is the share of one CPU a real-time protected process
	// may use, sampled every RTPoliceEvery; one over it in every sample
	// for RTPoliceFor is demoted to normal scheduling for good. The
	// duration lets a burst pass (sshd starting up, a class logging in at
	// once: on the emulated cgroup v2 node sshd's start-up alone took 5 %
	// of a CPU in the first second after it got real-time) while a
	// process that computes under real-time is demoted within seconds.
	RTMaxCPUShare float64
	RTPoliceEvery time.Duration
	RTPoliceFor   time.Duration

	KillGrace  time.Duration
	KillWait   time.Duration
	KillMax    int
	KillWindow time.Duration
	KillPause  time.Duration

	CPUEvery time.Duration
	Hang     victim.HangPolicy

	// StormEvery is how often the storm loop looks at the workspace's CPU
	// and demotes the busy processes while it is saturated.
	StormEvery time.Duration
	Storm      victim.StormPolicy

	ProbeEvery time.Duration

	// WatchEvery is how often guardian looks for the workspace container
	// while it has none, and checks that the guarded cgroup still has
	// processes: a restarted container (new cgroup) is guarded within about
	// this long after its process starts.
	WatchEvery time.Duration

	// ListenRetry is the first wait before binding the API port again
	// while it is taken (see ListenAPI), doubled each time up to
	// ListenRetryMax.
	ListenRetry    time.Duration
	ListenRetryMax time.Duration
}

// Defaults returns guardian's standard tuning: limits at 90 %/98 % of M,
// alert at 95 %, kill at 97 %, 4096 processes, a fork bomb at 500 births
// in 10 s, 3 kills in 30 s pause kills for 60 s, and the hang escalation
// 30 s/90 s/180 s/300 s at 95 % CPU, and a look at the workspace's
// cgroup every second. cmd/guardian starts from these and
// lets each be overridden by a GUARDIAN_* variable.
func Defaults() Config {
	return Config{
		HighFraction: 0.90, MaxFraction: 0.98, AlertFraction: 0.95, KillFraction: 0.97, HeldStall: 0.2,
		HandleOOM: true, MemoryPoll: 2 * time.Second,
		PidsMax: 4096, ForkThreshold: 50, ForkWindow: 10 * time.Second, ForkScan: 50 * time.Millisecond,
		ForkGrowthFraction: 0.125, ForkHorizon: time.Second, ForkBranchFraction: 0.125, PidsReserve: 64,
		FreezeTimeout: 2 * time.Second, HoldForksAfter: 250 * time.Millisecond, ContainRounds: 20, SpareLoginMax: 16,
		OwnCPUWeight: 10000,
		ProtectEvery: 30 * time.Second, SSHPort: 22,
		SessionExes: []string{"/usr/lib/openssh/sshd-session", "/usr/lib/openssh/sshd-auth"},
		ProtectPID1: true, ProtectInit: true,
		RTPriority: 1, RTRuntimeUS: 50_000, FallbackNice: -20,
		RTMaxCPUShare: 0.05, RTPoliceEvery: time.Second, RTPoliceFor: 3 * time.Second,
		KillGrace: 5 * time.Second, KillWait: 5 * time.Second,
		KillMax: 3, KillWindow: 30 * time.Second, KillPause: 60 * time.Second,
		CPUEvery: 5 * time.Second,
		Hang: victim.HangPolicy{CPUFraction: 0.95, AlertAfter: 30 * time.Second, KillOne: 90 * time.Second,
			KillThree: 180 * time.Second, KillAll: 300 * time.Second, Recovery: 10 * time.Second},
		StormEvery: time.Second,
		Storm:      victim.StormPolicy{CPUFraction: 0.9, Runnable: 2, MinShare: 0.01, Calm: 10 * time.Second},
		ProbeEvery: 30 * time.Second,
		WatchEvery: time.Second,

		ListenRetry: 250 * time.Millisecond, ListenRetryMax: 5 * time.Second,
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
	if c.HeldStall < 0 || c.HeldStall > 1 {
		errs = append(errs, fmt.Errorf("held stall must be in [0,1] (0: off), got %v", c.HeldStall))
	}
	frac("hang CPU fraction", c.Hang.CPUFraction)
	frac("fork growth fraction", c.ForkGrowthFraction)
	frac("fork branch fraction", c.ForkBranchFraction)
	frac("storm CPU fraction", c.Storm.CPUFraction)
	frac("storm minimum CPU share", c.Storm.MinShare)
	if c.StormEvery <= 0 || c.Storm.Calm < 0 || c.Storm.Runnable < 0 {
		errs = append(errs, fmt.Errorf("storm interval (%v) must be positive, storm calm (%v) and runnable factor (%v) not negative", c.StormEvery, c.Storm.Calm, c.Storm.Runnable))
	}
	if c.PidsReserve < 0 || c.ForkHorizon <= 0 {
		errs = append(errs, fmt.Errorf("pids reserve (%d) must not be negative and fork horizon (%v) must be positive", c.PidsReserve, c.ForkHorizon))
	}
	if c.HighFraction > c.MaxFraction || c.KillFraction > c.MaxFraction {
		errs = append(errs, fmt.Errorf("high (%v) and kill (%v) fractions must not exceed the max fraction (%v)", c.HighFraction, c.KillFraction, c.MaxFraction))
	}
	if c.AlertFraction >= c.KillFraction {
		errs = append(errs, fmt.Errorf("alert fraction (%v) must be below the kill fraction (%v): the alert comes before the kill", c.AlertFraction, c.KillFraction))
	}
	if h := c.Hang; !(0 < h.AlertAfter && h.AlertAfter < h.KillOne && h.KillOne < h.KillThree && h.KillThree < h.KillAll) {
		errs = append(errs, fmt.Errorf("hang steps must increase strictly from above zero: alert %v < kill one %v < kill three %v < kill all %v", h.AlertAfter, h.KillOne, h.KillThree, h.KillAll))
	}
	if c.ListenRetry <= 0 || c.ListenRetryMax < c.ListenRetry {
		errs = append(errs, fmt.Errorf("listen retry (%v) must be positive and at most the listen retry max (%v)", c.ListenRetry, c.ListenRetryMax))
	}
	if c.Hang.Recovery <= 0 {
		errs = append(errs, fmt.Errorf("hang recovery must be positive, got %v", c.Hang.Recovery))
	}
	if c.OwnCPUWeight < 0 || c.OwnCPUWeight > 10000 {
		errs = append(errs, fmt.Errorf("own CPU weight must be 0 (the runtime's) or 1 to 10000, got %d", c.OwnCPUWeight))
	}
	if c.SpareLoginMax < 0 {
		errs = append(errs, fmt.Errorf("spare login max must not be negative, got %d", c.SpareLoginMax))
	}
	if c.PidsMax <= 0 || c.ForkThreshold <= 0 || c.ContainRounds <= 0 || c.KillMax <= 0 {
		errs = append(errs, errors.New("pids max, fork threshold, contain rounds and kill max must be positive"))
	}
	for name, d := range map[string]time.Duration{"memory poll": c.MemoryPoll, "fork window": c.ForkWindow, "fork scan": c.ForkScan,
		"freeze timeout": c.FreezeTimeout, "protect interval": c.ProtectEvery, "kill wait": c.KillWait, "kill window": c.KillWindow,
		"CPU interval": c.CPUEvery, "probe interval": c.ProbeEvery, "watch interval": c.WatchEvery} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", name, d))
		}
	}
	frac("real-time CPU share", c.RTMaxCPUShare)
	if c.RTPoliceEvery <= 0 {
		errs = append(errs, fmt.Errorf("real-time policing interval must be positive, got %v", c.RTPoliceEvery))
	}
	if c.HoldForksAfter < 0 {
		errs = append(errs, fmt.Errorf("hold-forks delay must not be negative, got %v", c.HoldForksAfter))
	}
	if c.RTPoliceFor < 0 {
		errs = append(errs, fmt.Errorf("real-time policing duration must not be negative, got %v", c.RTPoliceFor))
	}
	if c.RTPriority < 0 || c.RTPriority > 99 {
		errs = append(errs, fmt.Errorf("real-time priority must be in [0,99] (0: no real-time, the nice fallback), got %d", c.RTPriority))
	}
	if c.SSHDExe != "" && !filepath.IsAbs(c.SSHDExe) {
		errs = append(errs, fmt.Errorf("sshd executable %q must be an absolute path", c.SSHDExe))
	}
	if c.SSHPort <= 0 || c.SSHPort > 65535 {
		errs = append(errs, fmt.Errorf("SSH port %d out of range", c.SSHPort))
	}
	return errors.Join(errs...)
}
