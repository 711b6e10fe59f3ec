// Package app wires labkeep's session functions from one Config: the
// PostgreSQL store, the Kubernetes adapter, the lab catalog, the Service
// and its HTTP handler. Every platform entry point (the Knative/on-prem
// server, the Lambda and Cloud Functions shims) fills Config with envconfig
// and calls Build, so all three run identical code.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"labkeep/shared/httpapi"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/pgstore"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// EnvPrefix is the prefix of every setting: LABKEEP_ENV, LABKEEP_…
const EnvPrefix = "LABKEEP"

// Config is every setting of the session functions, read from LABKEEP_*
// environment variables by envconfig. Defaults are the issue's.
type Config struct {
	// Env names this deployment (dev, prod, …); it labels every object so
	// environments sharing a namespace never touch each other's.
	Env         string `split_words:"true" required:"true"`
	DatabaseURL string `split_words:"true" required:"true"`
	// Namespace is where session objects live.
	Namespace          string        `split_words:"true" default:"labkeep-sessions"`
	SessionLifetime    time.Duration `split_words:"true" default:"60m"`
	SessionMaxLifetime time.Duration `split_words:"true" default:"180m"`
	DeadlineGrace      time.Duration `split_words:"true" default:"15m"`
	// MaxConcurrentVms (LABKEEP_MAX_CONCURRENT_VMS) caps live VMs in the namespace.
	MaxConcurrentVms int    `split_words:"true" default:"8"`
	LabsFile         string `split_words:"true" default:"/etc/labkeep/labs.yaml"`
	// JWTSecret is the HS256 secret shared with the portal (≥ 32 bytes).
	JWTSecret string `split_words:"true" required:"true"`
	HTTPAddr  string `split_words:"true" default:":8080"`
	// Kubeconfig is a kubeconfig file; empty means in-cluster credentials.
	Kubeconfig string `split_words:"true"`
	// KubeTimeout bounds every single Kubernetes API call.
	KubeTimeout time.Duration `split_words:"true" default:"10s"`
	// AnchorImage runs in the deadline anchor Job.
	AnchorImage string `split_words:"true" default:"registry.k8s.io/pause:3.10"`
	// AnchorBackoffLimit is how many real failures of the deadline anchor's
	// Pod are tolerated (disruptions — drain, eviction, node loss — never
	// count); AnchorCompletions how often it may end and be replaced. The
	// anchor's activeDeadlineSeconds stays the one deadline.
	AnchorBackoffLimit int32 `split_words:"true" default:"6"`
	AnchorCompletions  int32 `split_words:"true" default:"100"`
	// GuardianImage is the workspace Pod's sidecar.
	GuardianImage string `split_words:"true" default:"ghcr.io/labkeep/guardian:latest"`
	// SSHAuthorizedKeys (comma-separated) are installed on every node.
	SSHAuthorizedKeys []string `split_words:"true"`
	// RetryAfter is sent with 503 no_capacity.
	RetryAfter time.Duration `split_words:"true" default:"30s"`
	// SchedulerToken authenticates reapTick calls (issue 4); platform shims
	// send it with scheduled events. Required: without it no scheduled run
	// could authenticate and expired sessions would never be reaped.
	SchedulerToken string `split_words:"true" required:"true"`
	// CapacityWait bounds how long an open waits for the capacity lock
	// before answering 503 no_capacity. It must stay below
	// ReapProvisionGrace: a queued row has no VMs yet, and the reaper
	// treats such a row as a ghost after the grace.
	CapacityWait time.Duration `split_words:"true" default:"60s"`
	// ReapDryRun makes the reaper report what it would delete and delete
	// nothing (LABKEEP_REAP_DRY_RUN).
	ReapDryRun bool `split_words:"true"`
	// ReapRunDeadline bounds one reaper run; keep it below the schedule
	// period (1 minute) so runs never overlap.
	ReapRunDeadline time.Duration `split_words:"true" default:"50s"`
	// ReapProvisionTimeout: a session still provisioning after this is a
	// ghost.
	ReapProvisionTimeout time.Duration `split_words:"true" default:"10m"`
	// ReapProvisionGrace: how long a provisioning session may lack its VM
	// (the row is written before the objects).
	ReapProvisionGrace time.Duration `split_words:"true" default:"2m"`
	// KubeQPS and KubeBurst are the client-side rate limits towards the
	// API server (client-go's default of 5 QPS is far too low for a reaper
	// run over hundreds of sessions).
	KubeQPS   float32 `envconfig:"KUBE_QPS" default:"50"`
	KubeBurst int     `split_words:"true" default:"100"`
	// ReapWorkers is how many items a run handles at once.
	ReapWorkers int `split_words:"true" default:"8"`
	// AdminStatusRuns is how many recent runs GET /adminStatus shows.
	AdminStatusRuns int `split_words:"true" default:"20"`
}

// ReapSchedulePeriod is how often the scheduler calls reapTick (every
// shipped schedule is once a minute); a run's deadline must be below it.
const ReapSchedulePeriod = time.Minute

// MinSchedulerTokenBytes is the shortest LABKEEP_SCHEDULER_TOKEN accepted:
// it is the only credential of an endpoint that deletes things.
const MinSchedulerTokenBytes = 16

// Validate checks what envconfig cannot; every message names the variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s_%s: %s", EnvPrefix, name, fmt.Sprintf(format, args...)))
	}
	if msgs := validation.IsValidLabelValue(c.Env); c.Env == "" || len(msgs) > 0 {
		bad("ENV", "%q must be a non-empty Kubernetes label value", c.Env)
	}
	if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		bad("NAMESPACE", "%q is not a valid namespace name", c.Namespace)
	}
	if c.SessionLifetime <= 0 {
		bad("SESSION_LIFETIME", "must be positive, got %s", c.SessionLifetime)
	}
	if c.SessionMaxLifetime < c.SessionLifetime {
		bad("SESSION_MAX_LIFETIME", "%s is shorter than LABKEEP_SESSION_LIFETIME %s", c.SessionMaxLifetime, c.SessionLifetime)
	}
	if c.DeadlineGrace < 0 {
		bad("DEADLINE_GRACE", "must not be negative, got %s", c.DeadlineGrace)
	}
	if c.MaxConcurrentVms < 1 {
		bad("MAX_CONCURRENT_VMS", "must be at least 1, got %d", c.MaxConcurrentVms)
	}
	if c.SchedulerToken == "" {
		bad("SCHEDULER_TOKEN", "is required: without it scheduled reaper runs cannot authenticate and nothing expires")
	} else if len(c.SchedulerToken) < MinSchedulerTokenBytes {
		bad("SCHEDULER_TOKEN", "must be at least %d bytes, got %d", MinSchedulerTokenBytes, len(c.SchedulerToken))
	}
	if len(c.JWTSecret) < 32 {
		bad("JWT_SECRET", "must be at least 32 bytes, got %d", len(c.JWTSecret))
	}
	if c.KubeTimeout <= 0 {
		bad("KUBE_TIMEOUT", "must be positive, got %s", c.KubeTimeout)
	}
	if c.LabsFile == "" {
		bad("LABS_FILE", "is required")
	}
	// The reaper's and client's tunables: zero means the default (see
	// withDefaults), negative is a mistake.
	if c.AnchorBackoffLimit < 0 {
		bad("ANCHOR_BACKOFF_LIMIT", "must not be negative, got %d", c.AnchorBackoffLimit)
	}
	if c.AnchorCompletions < 0 {
		bad("ANCHOR_COMPLETIONS", "must not be negative, got %d", c.AnchorCompletions)
	}
	if c.ReapRunDeadline < 0 {
		bad("REAP_RUN_DEADLINE", "must not be negative, got %s", c.ReapRunDeadline)
	} else if c.ReapRunDeadline >= ReapSchedulePeriod {
		bad("REAP_RUN_DEADLINE", "%s must be below the reaper's schedule period %s, so runs never overlap", c.ReapRunDeadline, ReapSchedulePeriod)
	}
	if c.ReapProvisionTimeout < 0 {
		bad("REAP_PROVISION_TIMEOUT", "must not be negative, got %s", c.ReapProvisionTimeout)
	}
	if c.ReapProvisionGrace < 0 {
		bad("REAP_PROVISION_GRACE", "must not be negative, got %s", c.ReapProvisionGrace)
	}
	if c.CapacityWait < 0 {
		bad("CAPACITY_WAIT", "must not be negative, got %s", c.CapacityWait)
	}
	// Relations between tunables are checked on the effective values, so a
	// setting left at its default is compared as the default.
	d := c.withDefaults()
	if c.ReapProvisionTimeout >= 0 && c.ReapProvisionGrace >= 0 && d.ReapProvisionGrace > d.ReapProvisionTimeout {
		bad("REAP_PROVISION_GRACE", "%s exceeds LABKEEP_REAP_PROVISION_TIMEOUT %s", d.ReapProvisionGrace, d.ReapProvisionTimeout)
	}
	if c.CapacityWait >= 0 && c.ReapProvisionGrace >= 0 && d.CapacityWait >= d.ReapProvisionGrace {
		bad("CAPACITY_WAIT", "%s must be below LABKEEP_REAP_PROVISION_GRACE %s, or the reaper fails opens still queued for capacity", d.CapacityWait, d.ReapProvisionGrace)
	}
	if c.KubeQPS < 0 || c.KubeBurst < 0 {
		bad("KUBE_QPS", "and LABKEEP_KUBE_BURST must not be negative, got %v and %d", c.KubeQPS, c.KubeBurst)
	}
	if c.ReapWorkers < 0 {
		bad("REAP_WORKERS", "must not be negative, got %d", c.ReapWorkers)
	}
	if c.AdminStatusRuns < 0 {
		bad("ADMIN_STATUS_RUNS", "must not be negative, got %d", c.AdminStatusRuns)
	}
	return errors.Join(errs...)
}

// withDefaults fills the tunables left at zero (a Config built in code
// rather than by envconfig) with the envconfig defaults.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.ReapRunDeadline, 50*time.Second)
	def(&c.ReapProvisionTimeout, 10*time.Minute)
	def(&c.ReapProvisionGrace, 2*time.Minute)
	def(&c.CapacityWait, 60*time.Second)
	if c.KubeQPS == 0 {
		c.KubeQPS = 50
	}
	if c.KubeBurst == 0 {
		c.KubeBurst = 100
	}
	if c.ReapWorkers == 0 {
		c.ReapWorkers = 8
	}
	if c.AdminStatusRuns == 0 {
		c.AdminStatusRuns = 20
	}
	return c
}

// Policy is the lifetime policy the config describes.
func (c Config) Policy() lifetime.Policy {
	return lifetime.Policy{Lifetime: c.SessionLifetime, MaxLifetime: c.SessionMaxLifetime}
}

// App is the wired application. Close releases the database pool.
type App struct {
	Config   Config
	Store    *pgstore.PG
	Cluster  *kube.Cluster
	Labs     *labs.Catalog
	Sessions *session.Service
	// API serves the session endpoints; mount more routes in front of it.
	API *httpapi.API
	// Reaper is reapTick and adminReapNow.
	Reaper *reap.Reaper
	// Metrics is the registry behind /metrics.
	Metrics *prometheus.Registry
	// Kube is the rest config used, for other adapters.
	Kube *rest.Config

	handler http.Handler
}

// Build validates cfg and connects everything. now is the clock (time.Now
// in production). Errors name the setting at fault where there is one.
func Build(ctx context.Context, cfg Config, now func() time.Time, log *slog.Logger) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	catalog, err := labs.LoadFile(cfg.LabsFile)
	if err != nil {
		return nil, fmt.Errorf("%s_LABS_FILE: %w", EnvPrefix, err)
	}
	rc, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = cfg.KubeQPS, cfg.KubeBurst
	cluster, err := kube.NewForConfig(kube.Config{
		Namespace: cfg.Namespace, Env: cfg.Env,
		MaxLifetime: cfg.SessionMaxLifetime, DeadlineGrace: cfg.DeadlineGrace,
		AnchorImage: cfg.AnchorImage, GuardianImage: cfg.GuardianImage,
		AnchorBackoffLimit: cfg.AnchorBackoffLimit, AnchorCompletions: cfg.AnchorCompletions,
		SSHAuthorizedKeys: cfg.SSHAuthorizedKeys, CallTimeout: cfg.KubeTimeout,
	}, rc)
	if err != nil {
		return nil, err
	}
	store, err := pgstore.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("%s_DATABASE_URL: %w", EnvPrefix, err)
	}
	svc := &session.Service{
		Store: store, Cluster: cluster, Labs: catalog, Policy: cfg.Policy(),
		MaxVMs: cfg.MaxConcurrentVms, Now: now, Log: log, CapacityWait: cfg.CapacityWait,
	}
	api := httpapi.New(httpapi.Options{
		Sessions: svc, Auth: httpapi.NewAuthenticator([]byte(cfg.JWTSecret), now),
		Now: now, Log: log, RetryAfter: cfg.RetryAfter,
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reaper := &reap.Reaper{
		Store: store, Cluster: cluster, Now: now, Log: log, Metrics: reap.NewMetrics(reg),
		Config: reap.Config{
			DryRun: cfg.ReapDryRun, RunDeadline: cfg.ReapRunDeadline, Workers: cfg.ReapWorkers,
			Rules: reap.Rules{Env: cfg.Env, ProvisionTimeout: cfg.ReapProvisionTimeout, ProvisionGrace: cfg.ReapProvisionGrace},
		},
	}
	a := &App{Config: cfg, Store: store, Cluster: cluster, Labs: catalog, Sessions: svc, API: api, Kube: rc, Reaper: reaper, Metrics: reg}
	a.handler = api.WithReaper(httpapi.ReaperOptions{
		Reaper: reaper, SchedulerToken: cfg.SchedulerToken, Gatherer: reg,
		Status: func(ctx context.Context) (reap.Status, error) {
			return reaper.ReadStatus(ctx, store, cluster, cfg.AdminStatusRuns, cfg.MaxConcurrentVms)
		},
	})
	return a, nil
}

// Handler is the http.Handler every platform serves: the session
// endpoints and the reaper's.
func (a *App) Handler() http.Handler { return a.handler }

// Close releases the database pool.
func (a *App) Close() { a.Store.Close() }

// restConfig loads the cluster credentials.
func restConfig(kubeconfig string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if kubeconfig == "" {
		if rc, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("%s_KUBECONFIG is empty and not running in a cluster: %w", EnvPrefix, err)
		}
	} else if rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("%s_KUBECONFIG: %w", EnvPrefix, err)
	}
	return rc, nil
}
