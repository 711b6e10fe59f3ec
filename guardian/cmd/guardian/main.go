// Command guardian is the workspace sidecar: it keeps a root user's
// workspace container alive and reachable over SSH through cgroup limits,
// real-time scheduling for sshd, oom_score_adj and, in emergencies, killing
// unprotected processes. Configuration comes from environment variables,
// each written once in the settings table (options.settings; reference in
// README.md); it protects a Pod's workspace container, discovered, or any
// cgroup named explicitly.
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

// loadOptions reads the environment over the defaults and validates the
// result, so that a bad value stops guardian before it touches anything.
func loadOptions() (options, error) {
	o := defaultOptions()
	t := o.settings()
	if err := t.read(os.LookupEnv); err != nil {
		return options{}, err
	}
	_, port, err := net.SplitHostPort(o.SSHAddr)
	if err != nil {
		return options{}, fmt.Errorf("%s: %w", t.keyOf(&o.SSHAddr), err)
	}
	if o.Guard.SSHPort, err = strconv.Atoi(port); err != nil {
		return options{}, fmt.Errorf("%s: port %q: %w", t.keyOf(&o.SSHAddr), port, err)
	}
	if err := o.Guard.Validate(); err != nil {
		return options{}, fmt.Errorf("guardian config: %w", err)
	}
	if err := o.HTTP.Validate(); err != nil {
		return options{}, fmt.Errorf("guardian config: %w", err)
	}
	if o.StateMax < 4<<10 || o.StateMax > 64<<20 {
		return options{}, fmt.Errorf("%s must be within 4Ki and 64Mi, got %d", t.keyOf(&o.StateMax), o.StateMax)
	}
	if o.Alert.MaxText < 64 || o.Alert.MaxFields < 1 {
		return options{}, fmt.Errorf("%s must be at least 64 and %s at least 1, got %d and %d",
			t.keyOf(&o.Alert.MaxText), t.keyOf(&o.Alert.MaxFields), o.Alert.MaxText, o.Alert.MaxFields)
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
			fail(fmt.Errorf("%s: %w", c.settings().keyOf(&c.Listen), err))
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
// for it in alerts: the cgroup named explicitly (options.Cgroup), or the
// Pod's workspace container, found from the Pod's UID and the container's
// name from inside the Pod's shared PID namespace (see
// cgroupfs.PodWorkspace).
func locator(c options, layout cgroupfs.Layout) (guard.Workspace, string, error) {
	if c.Cgroup != "" {
		name := c.PodName
		if name == "" {
			name = c.Cgroup
		}
		return cgroupfs.Explicit{Layout: layout, Subtree: c.CgroupSubtree, Path: c.Cgroup}, name, nil
	}
	if c.PodUID == "" {
		t := c.settings()
		return nil, "", fmt.Errorf("set %s, or %s (and %s) to discover the workspace container",
			t.keyOf(&c.Cgroup), t.keyOf(&c.PodUID), t.keyOf(&c.ContainerName))
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
