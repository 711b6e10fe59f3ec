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
	"runtime"
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
	"labkeep/guardian/victim"
)

// config is filled from GUARDIAN_* variables (POD_UID, CONTAINER_NAME and
// POD_NAME are also read without the prefix, as the downward API sets them).
type config struct {
	Cgroup        string `envconfig:"CGROUP"`         // explicit cgroup: v2 directory, or v1 path relative to each controller mount
	CgroupSubtree string `envconfig:"CGROUP_SUBTREE"` // the subtree that may be touched; default: the Pod's (discovery) or the cgroup itself
	PodUID        string `envconfig:"POD_UID"`
	PodName       string `envconfig:"POD_NAME"`
	ContainerName string `envconfig:"CONTAINER_NAME" default:"workspace"`
	ProcRoot      string `envconfig:"PROC_ROOT" default:"/proc"`
	CgroupMount   string `envconfig:"CGROUP_MOUNT" default:"/sys/fs/cgroup"` // where the (host) cgroup hierarchies are mounted

	MemoryLimit   string        `envconfig:"MEMORY_LIMIT"` // bytes, or with Ki/Mi/Gi; empty: the cgroup's limit at first start
	HighFraction  float64       `envconfig:"MEMORY_HIGH_FRACTION" default:"0.90"`
	MaxFraction   float64       `envconfig:"MEMORY_MAX_FRACTION" default:"0.98"`
	AlertFraction float64       `envconfig:"MEMORY_ALERT_FRACTION" default:"0.95"`
	KillFraction  float64       `envconfig:"MEMORY_KILL_FRACTION" default:"0.97"`
	HandleOOM     bool          `envconfig:"HANDLE_OOM" default:"true"`
	MemoryPoll    time.Duration `envconfig:"MEMORY_POLL" default:"2s"`

	PidsMax       int           `envconfig:"PIDS_MAX" default:"4096"`
	ForkThreshold int           `envconfig:"FORK_THRESHOLD" default:"500"`
	ForkWindow    time.Duration `envconfig:"FORK_WINDOW" default:"10s"`
	ForkScan      time.Duration `envconfig:"FORK_SCAN" default:"1s"`
	FreezeTimeout time.Duration `envconfig:"FREEZE_TIMEOUT" default:"2s"`
	ContainRounds int           `envconfig:"CONTAIN_ROUNDS" default:"20"`

	SSHAddr      string        `envconfig:"SSH_ADDR" default:"127.0.0.1:22"`
	SessionExes  []string      `envconfig:"SSHD_SESSION_EXES" default:"/usr/lib/openssh/sshd-session,/usr/lib/openssh/sshd-auth"`
	ProtectExes  []string      `envconfig:"PROTECT_EXES"`
	ProtectPID1  bool          `envconfig:"PROTECT_PID1" default:"true"`
	ProtectInit  bool          `envconfig:"PROTECT_INIT" default:"true"`
	ProtectEvery time.Duration `envconfig:"PROTECT_EVERY" default:"30s"`
	RTPriority   int           `envconfig:"RT_PRIORITY" default:"1"`
	RTRuntimeUS  int           `envconfig:"RT_RUNTIME_US" default:"10000"`
	FallbackNice int           `envconfig:"FALLBACK_NICE" default:"-20"`

	KillGrace  time.Duration `envconfig:"KILL_GRACE" default:"5s"`
	KillWait   time.Duration `envconfig:"KILL_WAIT" default:"5s"`
	KillMax    int           `envconfig:"KILL_MAX" default:"3"`
	KillWindow time.Duration `envconfig:"KILL_WINDOW" default:"30s"`
	KillPause  time.Duration `envconfig:"KILL_PAUSE" default:"60s"`

	CPUEvery      time.Duration `envconfig:"CPU_EVERY" default:"5s"`
	HangCPU       float64       `envconfig:"HANG_CPU_FRACTION" default:"0.95"`
	HangAlert     time.Duration `envconfig:"HANG_ALERT_AFTER" default:"30s"`
	HangKillOne   time.Duration `envconfig:"HANG_KILL_ONE_AFTER" default:"90s"`
	HangKillThree time.Duration `envconfig:"HANG_KILL_THREE_AFTER" default:"180s"`
	HangKillAll   time.Duration `envconfig:"HANG_KILL_ALL_AFTER" default:"300s"`
	HangRecovery  time.Duration `envconfig:"HANG_RECOVERY" default:"10s"`

	ProbeEvery   time.Duration `envconfig:"PROBE_EVERY" default:"30s"`
	ProbeTimeout time.Duration `envconfig:"PROBE_TIMEOUT" default:"5s"`

	Listen       string        `envconfig:"LISTEN" default:":9090"`
	CleanupToken string        `envconfig:"CLEANUP_TOKEN"`
	WebhookURL   string        `envconfig:"WEBHOOK_URL"`
	AlertWindow  time.Duration `envconfig:"ALERT_WINDOW" default:"60s"`
	AlertRate    int           `envconfig:"ALERT_RATE_PER_MIN" default:"20"`
	AlertBurst   int           `envconfig:"ALERT_BURST" default:"5"`
	StatePath    string        `envconfig:"STATE_PATH" default:"/var/lib/guardian/state.json"`
	LogLevel     slog.Level    `envconfig:"LOG_LEVEL" default:"INFO"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "guardian:", err)
		os.Exit(1)
	}
}

func run() error {
	var c config
	if err := envconfig.Process("guardian", &c); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: c.LogLevel}))
	memLimit, err := parseBytes(c.MemoryLimit)
	if err != nil {
		return fmt.Errorf("GUARDIAN_MEMORY_LIMIT: %w", err)
	}
	_, portStr, err := net.SplitHostPort(c.SSHAddr)
	if err != nil {
		return fmt.Errorf("GUARDIAN_SSH_ADDR: %w", err)
	}
	sshPort, _ := strconv.Atoi(portStr)

	layout, err := cgroupfs.ReadLayout(c.CgroupMount)
	if err != nil {
		return err
	}
	cgPath, subtree := c.Cgroup, c.CgroupSubtree
	if cgPath == "" {
		if c.PodUID == "" {
			return errors.New("set GUARDIAN_CGROUP, or POD_UID (and CONTAINER_NAME) to discover the workspace container")
		}
		self, _ := os.ReadFile("/proc/self/cgroup")
		ctrl := ""
		if layout.IsV1() {
			ctrl = "memory"
		}
		own, _ := cgroupfs.OwnCgroup(string(self), ctrl)
		var pod string
		cgPath, pod, err = cgroupfs.Discover(layout, c.ProcRoot, c.PodUID, c.ContainerName, own)
		if err != nil {
			return fmt.Errorf("discover the workspace cgroup: %w", err)
		}
		if subtree == "" {
			subtree = pod
		}
	}
	cg, err := cgroupfs.Open(layout, subtree, cgPath)
	if err != nil {
		return err
	}
	ctrl := ""
	if cg.Version() == 1 {
		ctrl = "memory"
	}
	procs := procfs.New(c.ProcRoot, ctrl)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	workspace := c.PodName
	if workspace == "" {
		workspace = cgPath
	}
	alerts := alert.New(alert.Config{Workspace: workspace, Window: c.AlertWindow, RatePerMin: c.AlertRate, Burst: c.AlertBurst, WebhookURL: c.WebhookURL},
		time.Now, &http.Client{Timeout: 10 * time.Second}, log)

	statePath := c.StatePath
	if statePath != "" {
		if err := os.MkdirAll(filepath.Dir(statePath), 0o700); err != nil {
			log.Error("state directory unusable: state will not survive a restart", "path", statePath, "err", err)
			statePath = ""
		}
	}
	cfg := guard.Config{
		MemoryLimit: memLimit, HighFraction: c.HighFraction, MaxFraction: c.MaxFraction, AlertFraction: c.AlertFraction, KillFraction: c.KillFraction,
		HandleOOM: c.HandleOOM, MemoryPoll: c.MemoryPoll,
		PidsMax: c.PidsMax, ForkThreshold: c.ForkThreshold, ForkWindow: c.ForkWindow, ForkScan: c.ForkScan, FreezeTimeout: c.FreezeTimeout, ContainRounds: c.ContainRounds,
		ProtectEvery: c.ProtectEvery, SSHPort: sshPort, SessionExes: c.SessionExes, ProtectExes: c.ProtectExes, ProtectPID1: c.ProtectPID1, ProtectInit: c.ProtectInit,
		RTPriority: c.RTPriority, RTRuntimeUS: c.RTRuntimeUS, FallbackNice: c.FallbackNice,
		KillGrace: c.KillGrace, KillWait: c.KillWait, KillMax: c.KillMax, KillWindow: c.KillWindow, KillPause: c.KillPause,
		CPUEvery: c.CPUEvery, OnlineCPUs: float64(runtime.NumCPU()),
		Hang:       victim.HangPolicy{CPUFraction: c.HangCPU, AlertAfter: c.HangAlert, KillOne: c.HangKillOne, KillThree: c.HangKillThree, KillAll: c.HangKillAll, Recovery: c.HangRecovery},
		ProbeEvery: c.ProbeEvery, StatePath: statePath,
	}
	g, err := guard.New(cfg, guard.Deps{
		Cgroup: cg, Procs: procs,
		Killer:    &killer.Killer{Procs: procs, Gone: func(err error) bool { return errors.Is(err, procfs.ErrGone) }},
		Scheduler: sched.OS{}, Prober: sshprobe.Prober{Addr: c.SSHAddr, Timeout: c.ProbeTimeout},
		Alerts: alerts, Metrics: guard.NewMetrics(reg), Log: log,
	})
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := g.Start(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("GUARDIAN_LISTEN: %w", err)
	}
	srv := &http.Server{Handler: httpapi.New(g, c.CleanupToken, reg, log), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	log.Info("guardian running", "cgroup", cg.String(), "api", ln.Addr().String(), "ssh", c.SSHAddr)
	g.Run(ctx)
	shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(shutdown)
	log.Info("guardian stopped; kernel limits stay in place")
	return nil
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
