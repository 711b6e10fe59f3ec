// Command guardian is the workspace sidecar: it keeps a root user's
// workspace container alive and reachable over SSH through cgroup limits,
// real-time scheduling for sshd, oom_score_adj and, in emergencies, killing
// unprotected processes. Configuration comes from GUARDIAN_* environment
// variables (see README.md); it protects a Pod's workspace container found
// from POD_UID/CONTAINER_NAME, or any cgroup given by GUARDIAN_CGROUP.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"labkeep/guardian/alert"
	"labkeep/guardian/cgroupfs"
	"labkeep/guardian/guard"
	"labkeep/guardian/httpapi"
	"labkeep/guardian/killer"
	"labkeep/guardian/procfs"
	"labkeep/guardian/sched"
	"labkeep/guardian/sshprobe"
)

// options is everything guardian runs with: the configurations of the
// packages it wires (their defaults come from the packages) and main's own
// wiring settings.
type options struct {
	Guard guard.Config
	Alert alert.Config
	HTTP  httpapi.ServerConfig

	Cgroup        string // explicit cgroup: v2 directory, or v1 path relative to each controller mount
	CgroupSubtree string // the subtree that may be touched; default: the Pod's (discovery) or the cgroup itself
	PodUID        string
	PodName       string
	ContainerName string
	ProcRoot      string
	CgroupMount   string // where the (host) cgroup hierarchies are mounted

	SSHAddr      string
	ProbeTimeout time.Duration
	Listen       string
	CleanupToken string
	StatePath    string
	StateMax     uint64 // bytes the state file is kept within
	LogLevel     slog.Level
}

// defaultOptions composes the packages' defaults with main's own.
func defaultOptions() options {
	return options{
		Guard: guard.Defaults(), Alert: alert.Defaults(), HTTP: httpapi.Defaults(),
		ContainerName: "workspace", ProcRoot: "/proc", CgroupMount: "/sys/fs/cgroup",
		SSHAddr: "127.0.0.1:22", ProbeTimeout: 5 * time.Second, Listen: ":9090",
		StatePath: "/var/lib/guardian/state.json", StateMax: guard.DefaultStateMaxBytes, LogLevel: slog.LevelInfo,
	}
}

// variables binds each GUARDIAN_* variable to the option it sets. A
// variable that is not set leaves its option at the default; none carries
// a default of its own. envconfig also reads every variable without the
// prefix, which is how POD_UID, POD_NAME and CONTAINER_NAME arrive from the
// downward API.
type variables struct {
	Cgroup        *string `envconfig:"CGROUP"`
	CgroupSubtree *string `envconfig:"CGROUP_SUBTREE"`
	PodUID        *string `envconfig:"POD_UID"`
	PodName       *string `envconfig:"POD_NAME"`
	ContainerName *string `envconfig:"CONTAINER_NAME"`
	ProcRoot      *string `envconfig:"PROC_ROOT"`
	CgroupMount   *string `envconfig:"CGROUP_MOUNT"`

	MemoryLimit   *byteSize      `envconfig:"MEMORY_LIMIT"` // bytes, or with Ki/Mi/Gi; unset: the cgroup's limit at first start
	HighFraction  *float64       `envconfig:"MEMORY_HIGH_FRACTION"`
	MaxFraction   *float64       `envconfig:"MEMORY_MAX_FRACTION"`
	AlertFraction *float64       `envconfig:"MEMORY_ALERT_FRACTION"`
	KillFraction  *float64       `envconfig:"MEMORY_KILL_FRACTION"`
	HandleOOM     *bool          `envconfig:"HANDLE_OOM"`
	MemoryPoll    *time.Duration `envconfig:"MEMORY_POLL"`

	PidsMax       *int           `envconfig:"PIDS_MAX"`
	ForkThreshold *int           `envconfig:"FORK_THRESHOLD"`
	ForkWindow    *time.Duration `envconfig:"FORK_WINDOW"`
	ForkScan      *time.Duration `envconfig:"FORK_SCAN"`
	ForkGrowth    *float64       `envconfig:"FORK_GROWTH_FRACTION"`
	ForkHorizon   *time.Duration `envconfig:"FORK_HORIZON"`
	PidsReserve   *int           `envconfig:"PIDS_RESERVE"`
	FreezeTimeout *time.Duration `envconfig:"FREEZE_TIMEOUT"`
	ContainRounds *int           `envconfig:"CONTAIN_ROUNDS"`
	SpareLoginMax *int           `envconfig:"CONTAIN_SPARE_LOGIN_MAX"`

	SSHAddr      *string        `envconfig:"SSH_ADDR"` // its port is guard.Config.SSHPort
	SessionExes  *[]string      `envconfig:"SSHD_SESSION_EXES"`
	ProtectExes  *[]string      `envconfig:"PROTECT_EXES"`
	ProtectPID1  *bool          `envconfig:"PROTECT_PID1"`
	ProtectInit  *bool          `envconfig:"PROTECT_INIT"`
	ProtectEvery *time.Duration `envconfig:"PROTECT_EVERY"`
	RTPriority   *int           `envconfig:"RT_PRIORITY"`
	RTRuntimeUS  *int           `envconfig:"RT_RUNTIME_US"`
	FallbackNice *int           `envconfig:"FALLBACK_NICE"`
	SSHDExe      *string        `envconfig:"SSHD_EXE"`
	RTMaxCPU     *float64       `envconfig:"RT_MAX_CPU_SHARE"`
	RTPolice     *time.Duration `envconfig:"RT_POLICE_EVERY"`

	KillGrace  *time.Duration `envconfig:"KILL_GRACE"`
	KillWait   *time.Duration `envconfig:"KILL_WAIT"`
	KillMax    *int           `envconfig:"KILL_MAX"`
	KillWindow *time.Duration `envconfig:"KILL_WINDOW"`
	KillPause  *time.Duration `envconfig:"KILL_PAUSE"`

	CPUEvery      *time.Duration `envconfig:"CPU_EVERY"`
	HangCPU       *float64       `envconfig:"HANG_CPU_FRACTION"`
	HangAlert     *time.Duration `envconfig:"HANG_ALERT_AFTER"`
	HangKillOne   *time.Duration `envconfig:"HANG_KILL_ONE_AFTER"`
	HangKillThree *time.Duration `envconfig:"HANG_KILL_THREE_AFTER"`
	HangKillAll   *time.Duration `envconfig:"HANG_KILL_ALL_AFTER"`
	HangRecovery  *time.Duration `envconfig:"HANG_RECOVERY"`
	StormEvery    *time.Duration `envconfig:"STORM_EVERY"`
	StormCPU      *float64       `envconfig:"STORM_CPU_FRACTION"`
	StormRunnable *float64       `envconfig:"STORM_RUNNABLE"`
	StormMinShare *float64       `envconfig:"STORM_MIN_SHARE"`
	StormCalm     *time.Duration `envconfig:"STORM_CALM"`

	ProbeEvery   *time.Duration `envconfig:"PROBE_EVERY"`
	ProbeTimeout *time.Duration `envconfig:"PROBE_TIMEOUT"`
	WatchEvery   *time.Duration `envconfig:"WATCH_EVERY"`
	ListenRetry  *time.Duration `envconfig:"LISTEN_RETRY"`
	ListenMax    *time.Duration `envconfig:"LISTEN_RETRY_MAX"`

	Listen       *string        `envconfig:"LISTEN"`
	HTTPHeader   *time.Duration `envconfig:"HTTP_READ_HEADER_TIMEOUT"`
	HTTPRead     *time.Duration `envconfig:"HTTP_READ_TIMEOUT"`
	HTTPWrite    *time.Duration `envconfig:"HTTP_WRITE_TIMEOUT"`
	HTTPIdle     *time.Duration `envconfig:"HTTP_IDLE_TIMEOUT"`
	HTTPMaxConns *int           `envconfig:"HTTP_MAX_CONNS"`
	CleanupToken *string        `envconfig:"CLEANUP_TOKEN"`
	WebhookURL   *string        `envconfig:"WEBHOOK_URL"`
	AlertWindow  *time.Duration `envconfig:"ALERT_WINDOW"`
	AlertRate    *int           `envconfig:"ALERT_RATE_PER_MIN"`
	AlertBurst   *int           `envconfig:"ALERT_BURST"`
	StatePath    *string        `envconfig:"STATE_PATH"`
	StateMax     *byteSize      `envconfig:"STATE_MAX_BYTES"`
	AlertText    *int           `envconfig:"ALERT_MAX_TEXT"`
	AlertFields  *int           `envconfig:"ALERT_MAX_FIELDS"`
	LogLevel     *slog.Level    `envconfig:"LOG_LEVEL"`
}

// bind points every variable at its option in o.
func bind(o *options) variables {
	g, h, a := &o.Guard, &o.Guard.Hang, &o.Alert
	return variables{
		Cgroup: &o.Cgroup, CgroupSubtree: &o.CgroupSubtree, PodUID: &o.PodUID, PodName: &o.PodName,
		ContainerName: &o.ContainerName, ProcRoot: &o.ProcRoot, CgroupMount: &o.CgroupMount,

		MemoryLimit: (*byteSize)(&g.MemoryLimit), HighFraction: &g.HighFraction, MaxFraction: &g.MaxFraction,
		AlertFraction: &g.AlertFraction, KillFraction: &g.KillFraction, HandleOOM: &g.HandleOOM, MemoryPoll: &g.MemoryPoll,

		PidsMax: &g.PidsMax, ForkThreshold: &g.ForkThreshold, ForkWindow: &g.ForkWindow, ForkScan: &g.ForkScan,
		ForkGrowth: &g.ForkGrowthFraction, ForkHorizon: &g.ForkHorizon, PidsReserve: &g.PidsReserve,
		FreezeTimeout: &g.FreezeTimeout, ContainRounds: &g.ContainRounds, SpareLoginMax: &g.SpareLoginMax,

		SSHAddr: &o.SSHAddr, SessionExes: &g.SessionExes, ProtectExes: &g.ProtectExes, ProtectPID1: &g.ProtectPID1,
		ProtectInit: &g.ProtectInit, ProtectEvery: &g.ProtectEvery, RTPriority: &g.RTPriority, RTRuntimeUS: &g.RTRuntimeUS,
		FallbackNice: &g.FallbackNice, SSHDExe: &g.SSHDExe, RTMaxCPU: &g.RTMaxCPUShare, RTPolice: &g.RTPoliceEvery,

		KillGrace: &g.KillGrace, KillWait: &g.KillWait, KillMax: &g.KillMax, KillWindow: &g.KillWindow, KillPause: &g.KillPause,

		CPUEvery: &g.CPUEvery, HangCPU: &h.CPUFraction, HangAlert: &h.AlertAfter, HangKillOne: &h.KillOne,
		HangKillThree: &h.KillThree, HangKillAll: &h.KillAll, HangRecovery: &h.Recovery,
		StormEvery: &g.StormEvery, StormCPU: &g.Storm.CPUFraction, StormRunnable: &g.Storm.Runnable, StormMinShare: &g.Storm.MinShare, StormCalm: &g.Storm.Calm,

		ProbeEvery: &g.ProbeEvery, ProbeTimeout: &o.ProbeTimeout, WatchEvery: &g.WatchEvery,
		ListenRetry: &g.ListenRetry, ListenMax: &g.ListenRetryMax,

		HTTPHeader: &o.HTTP.ReadHeaderTimeout, HTTPRead: &o.HTTP.ReadTimeout, HTTPWrite: &o.HTTP.WriteTimeout,
		HTTPIdle: &o.HTTP.IdleTimeout, HTTPMaxConns: &o.HTTP.MaxConns,
		Listen: &o.Listen, CleanupToken: &o.CleanupToken, WebhookURL: &a.WebhookURL, AlertWindow: &a.Window,
		AlertRate: &a.RatePerMin, AlertBurst: &a.Burst, StatePath: &o.StatePath, LogLevel: &o.LogLevel,
		StateMax: (*byteSize)(&o.StateMax), AlertText: &a.MaxText, AlertFields: &a.MaxFields,
	}
}

// loadOptions reads the environment over the defaults and validates the
// result, so that a bad value stops guardian before it touches anything.
func loadOptions() (options, error) {
	o := defaultOptions()
	v := bind(&o)
	if err := envconfig.Process("guardian", &v); err != nil {
		return options{}, err
	}
	_, port, err := net.SplitHostPort(o.SSHAddr)
	if err != nil {
		return options{}, fmt.Errorf("GUARDIAN_SSH_ADDR: %w", err)
	}
	if o.Guard.SSHPort, err = strconv.Atoi(port); err != nil {
		return options{}, fmt.Errorf("GUARDIAN_SSH_ADDR: port %q: %w", port, err)
	}
	if err := o.Guard.Validate(); err != nil {
		return options{}, fmt.Errorf("guardian config: %w", err)
	}
	if err := o.HTTP.Validate(); err != nil {
		return options{}, fmt.Errorf("guardian config: %w", err)
	}
	if o.StateMax < 4<<10 || o.StateMax > 64<<20 {
		return options{}, fmt.Errorf("GUARDIAN_STATE_MAX_BYTES must be within 4Ki and 64Mi, got %d", o.StateMax)
	}
	if o.Alert.MaxText < 64 || o.Alert.MaxFields < 1 {
		return options{}, fmt.Errorf("GUARDIAN_ALERT_MAX_TEXT must be at least 64 and GUARDIAN_ALERT_MAX_FIELDS at least 1, got %d and %d", o.Alert.MaxText, o.Alert.MaxFields)
	}
	return o, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "guardian:", err)
		os.Exit(1)
	}
}

func run() error {
	c, err := loadOptions()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: c.LogLevel}))

	layout, err := cgroupfs.ReadLayout(c.CgroupMount)
	if err != nil {
		return err
	}
	workspace, name, err := locator(c, layout)
	if err != nil {
		return err
	}
	ctrl := ""
	if layout.IsV1() {
		ctrl = "memory"
	}
	procs := procfs.New(c.ProcRoot, ctrl)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	alertCfg := c.Alert
	alertCfg.Workspace = name
	alerts := alert.New(alertCfg, time.Now, &http.Client{Timeout: 10 * time.Second}, log)

	var store guard.StateStore
	if c.StatePath != "" {
		if err := os.MkdirAll(filepath.Dir(c.StatePath), 0o700); err != nil {
			log.Error("state directory unusable: state will not survive a restart", "path", c.StatePath, "err", err)
		} else {
			store = guard.FileStore{Path: c.StatePath, MaxBytes: int(c.StateMax)}
		}
	}
	g, err := guard.New(c.Guard, guard.Deps{
		Workspace: workspace, Procs: procs,
		Killer:    &killer.Killer{Procs: procs, Gone: func(err error) bool { return errors.Is(err, procfs.ErrGone) }},
		Scheduler: sched.OS{}, Prober: sshprobe.Prober{Addr: c.SSHAddr, Timeout: c.ProbeTimeout},
		Alerts: alerts, Metrics: guard.NewMetrics(reg), Log: log, State: store,
	})
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := g.Start(ctx); err != nil {
		return err
	}
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	srv := c.HTTP.NewServer(httpapi.New(g, c.CleanupToken, reg, log))
	go func() {
		// The port may be taken by the workspace (see ListenAPI): the
		// API, probes included, answers once it is taken back.
		ln, err := g.ListenAPI(ctx, c.Listen)
		if err != nil {
			fail(fmt.Errorf("GUARDIAN_LISTEN: %w", err))
			return
		}
		log.Info("API listening", "addr", ln.Addr().String())
		if err := srv.Serve(c.HTTP.Listener(ln)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	log.Info("guardian running", "workspace", name, "api", c.Listen, "ssh", c.SSHAddr)
	runErr := g.Run(ctx)
	if cause := context.Cause(ctx); runErr == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		runErr = cause
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(shutdown)
	if runErr != nil {
		return runErr
	}
	log.Info("guardian stopped; kernel limits stay in place")
	return nil
}

// locator returns how guardian finds the workspace's cgroup, and a name
// for it in alerts: the cgroup given by GUARDIAN_CGROUP, or the Pod's
// workspace container, found from POD_UID and CONTAINER_NAME from inside
// the Pod's shared PID namespace (see cgroupfs.PodWorkspace).
func locator(c options, layout cgroupfs.Layout) (guard.Workspace, string, error) {
	if c.Cgroup != "" {
		name := c.PodName
		if name == "" {
			name = c.Cgroup
		}
		return cgroupfs.Explicit{Layout: layout, Subtree: c.CgroupSubtree, Path: c.Cgroup}, name, nil
	}
	if c.PodUID == "" {
		return nil, "", errors.New("set GUARDIAN_CGROUP, or POD_UID (and CONTAINER_NAME) to discover the workspace container")
	}
	if _, _, err := cgroupfs.PodDirNames(c.PodUID); err != nil {
		return nil, "", err
	}
	// In the Pod's shared PID namespace PID 1 is the sandbox; guardian
	// being PID 1 means it has a namespace of its own and can neither see
	// nor signal the workspace's processes.
	if os.Getpid() == 1 {
		return nil, "", errors.New("guardian runs as PID 1: the Pod must set shareProcessNamespace: true")
	}
	name := c.PodName
	if name == "" {
		name = "pod " + c.PodUID
	}
	return &cgroupfs.PodWorkspace{Layout: layout, ProcRoot: c.ProcRoot, PodUID: c.PodUID, ContainerName: c.ContainerName,
		SelfPID: os.Getpid(), SandboxPID: 1}, name, nil
}

// byteSize is a byte count read from the environment (envconfig.Decoder).
type byteSize uint64

// Decode implements envconfig.Decoder.
func (b *byteSize) Decode(s string) error {
	v, err := parseBytes(s)
	*b = byteSize(v)
	return err
}

// parseBytes parses a byte count with an optional binary suffix (Ki, Mi,
// Gi, Ti) as Kubernetes quantities use; empty means 0 (unset).
func parseBytes(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	mult := uint64(1)
	for suffix, m := range map[string]uint64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40} {
		if strings.HasSuffix(s, suffix) {
			s, mult = strings.TrimSuffix(s, suffix), m
			break
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a byte count", s)
	}
	return v * mult, nil
}
