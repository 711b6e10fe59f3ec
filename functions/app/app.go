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
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"labkeep/shared/access"
	"labkeep/shared/alerts"
	"labkeep/shared/httpapi"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/pgstore"
	"labkeep/shared/portal"
	"labkeep/shared/reap"
	"labkeep/shared/session"
	"labkeep/shared/setting"
	"labkeep/shared/terminal"
	"labkeep/shared/warmpool"
)

// EnvPrefix is the prefix of every setting: LABKEEP_ENV, LABKEEP_…
const EnvPrefix = "LABKEEP"

// Config is every setting of the session functions, read from LABKEEP_*
// environment variables by envconfig over DefaultConfig: a variable that is
// not set keeps the default, and every default is the owning package's
// (kube, session, reap, lifetime, httpapi), written once there. The four
// required settings (env, database URL, JWT secret, scheduler token) have
// none; Validate names each one that is missing.
type Config struct {
	// Env names this deployment (dev, prod, …); it labels every object so
	// environments sharing a namespace never touch each other's.
	Env         string `split_words:"true"`
	DatabaseURL string `split_words:"true"`
	// Namespace is where session objects live.
	Namespace          string        `split_words:"true"`
	SessionLifetime    time.Duration `split_words:"true"`
	SessionMaxLifetime time.Duration `split_words:"true"`
	DeadlineGrace      time.Duration `split_words:"true"`
	// MaxConcurrentVms (LABKEEP_MAX_CONCURRENT_VMS) caps live VMs in the namespace.
	MaxConcurrentVms int `split_words:"true"`
	// MaxConcurrentPods (LABKEEP_MAX_CONCURRENT_PODS) caps live workspace
	// Pods (pod labs) in the namespace.
	MaxConcurrentPods int    `split_words:"true"`
	LabsFile          string `split_words:"true"`
	// LabsReload is how often LabsFile is re-read (labs.Live); 0 reads it
	// only at start.
	LabsReload time.Duration `split_words:"true"`
	// JWTSecret is the HS256 secret shared with the portal (≥ 32 bytes).
	JWTSecret string `split_words:"true"`
	HTTPAddr  string `split_words:"true"`
	// MetricsAddr, when set, is where labkeep-http serves /metrics, apart
	// from the public handler (which then has none); empty keeps /metrics
	// on the public handler (Lambda, Cloud Functions).
	MetricsAddr string `split_words:"true"`

	// JWTAudience and JWTIssuer, when set, are the aud and iss every
	// portal token must carry; JWTMaxLifetime bounds how long a token may
	// be valid and JWTLeeway is the clock skew tolerated (see
	// access.TokenRules).
	JWTAudience    string        `split_words:"true"`
	JWTIssuer      string        `split_words:"true"`
	JWTMaxLifetime time.Duration `split_words:"true"`
	JWTLeeway      time.Duration `split_words:"true"`

	// Kubeconfig is a kubeconfig file; empty means in-cluster credentials.
	Kubeconfig string `split_words:"true"`
	// KubeTimeout bounds every single Kubernetes API call.
	KubeTimeout time.Duration `split_words:"true"`
	// AnchorImage runs in the deadline anchor Job.
	AnchorImage string `split_words:"true"`
	// AnchorBackoffLimit is how many real failures of the deadline anchor's
	// Pod are tolerated (disruptions — drain, eviction, node loss — never
	// count); AnchorCompletions how often it may end and be replaced. The
	// anchor's activeDeadlineSeconds stays the one deadline.
	AnchorBackoffLimit int32 `split_words:"true"`
	AnchorCompletions  int32 `split_words:"true"`
	// GuardianImage is the workspace Pod's sidecar.
	GuardianImage string `split_words:"true"`
	// WorkspacePodFile is a workspace Pod definition to use instead of the
	// built-in infra/guardian/workspace-pod.yaml (tolerations, node
	// selectors, capabilities a platform's nodes cannot grant).
	WorkspacePodFile string `split_words:"true"`
	// PlatformSSHKeys (comma-separated authorized_keys lines) are the
	// platform's own keys (grader, operator), authorized on every node of
	// every session beside the session's own student key. Never give one to
	// a student: it enters every lab.
	PlatformSSHKeys []string `envconfig:"PLATFORM_SSH_KEYS"`
	// SSHAuthorizedKeys is the old name of PlatformSSHKeys; Validate
	// refuses it, so a deployment that still sets it stops with a message
	// instead of silently losing its grader key.
	SSHAuthorizedKeys []string `split_words:"true"`
	// SSHSourceCIDRs (comma-separated) are where students' SSH reaches the
	// labs from; EgressBlockedCIDRs the internal ranges labs never reach
	// (see kube.Config).
	SSHSourceCIDRs     []string `envconfig:"SSH_SOURCE_CIDRS"`
	EgressBlockedCIDRs []string `envconfig:"EGRESS_BLOCKED_CIDRS"`
	// PlatformNamespace is the functions' own namespace, whose Pods may
	// call guardian's API in workspace Pods (see kube.Config).
	PlatformNamespace string `split_words:"true"`
	// RetryAfter is sent with 503 no_capacity.
	RetryAfter time.Duration `split_words:"true"`
	// SchedulerToken authenticates reapTick calls; platform shims send it
	// with scheduled events. Required: without it no scheduled run could
	// authenticate and expired sessions would never be reaped.
	SchedulerToken string `split_words:"true"`
	// CapacityWait bounds how long an open waits for the capacity lock
	// before answering 503 no_capacity. It must stay below
	// ReapProvisionGrace: a queued row has no VMs yet, and the reaper
	// treats such a row as a ghost after the grace.
	CapacityWait time.Duration `split_words:"true"`
	// CleanupTimeout bounds the rollback of a failed open.
	CleanupTimeout time.Duration `split_words:"true"`
	// QueueIdle is how long a waitlist entry nobody polls keeps its place.
	QueueIdle time.Duration `split_words:"true"`
	// ReapDryRun makes the reaper report what it would delete and delete
	// nothing (LABKEEP_REAP_DRY_RUN).
	ReapDryRun bool `split_words:"true"`
	// ReapRunDeadline bounds one reaper run; keep it below the schedule
	// period (1 minute) so runs never overlap.
	ReapRunDeadline time.Duration `split_words:"true"`
	// ReapProvisionTimeout: a session still provisioning after this is a
	// ghost.
	ReapProvisionTimeout time.Duration `split_words:"true"`
	// ReapProvisionGrace: how long a provisioning session may lack its VM
	// (the row is written before the objects).
	ReapProvisionGrace time.Duration `split_words:"true"`
	// KubeQPS and KubeBurst are the client-side rate limits towards the
	// API server.
	KubeQPS   float32 `envconfig:"KUBE_QPS"`
	KubeBurst int     `split_words:"true"`
	// ReapWorkers is how many items a run handles at once.
	ReapWorkers int `split_words:"true"`
	// ReapRetention is how long reaper run records are kept;
	// ReapRetentionBatch how many older ones one run deletes at most.
	ReapRetention      time.Duration `split_words:"true"`
	ReapRetentionBatch int           `split_words:"true"`
	// ReapAbsentConfirm: a running session's VMI or Pod missing at one look
	// is a ghost only if a look at least this much later misses it too;
	// ReapDownGrace: one whose VM or Pod is reported down, after this long.
	ReapAbsentConfirm time.Duration `split_words:"true"`
	ReapDownGrace     time.Duration `split_words:"true"`
	// DBMaxConns is the main database pool's size, the connections student
	// calls use (0: the DSN's pool_max_conns, or pgxpool's default, the
	// larger of 4 and the number of CPUs). ReapDBConns is the reaper's own
	// pool on the same database, so a run can never take the connections
	// student calls need.
	DBMaxConns  int `envconfig:"DB_MAX_CONNS"`
	ReapDBConns int `envconfig:"REAP_DB_CONNS"`
	// AdminStatusRuns is how many recent runs GET /adminStatus shows.
	AdminStatusRuns int `split_words:"true"`
	// Portal serves the student page under /portal/ (LABKEEP_PORTAL).
	Portal bool `envconfig:"PORTAL"`
	// GuardianWebhookURL, when set, is labkeep's POST /guardianAlert as
	// the workspaces reach it: every workspace's guardian posts its alerts
	// there with credentials of its own session (see AlertKey).
	GuardianWebhookURL string `split_words:"true"`
	// GuardianAlertMaxText, GuardianAlertMaxFields and
	// GuardianAlertsPerSession bound the guardian alerts labkeep stores
	// (alerts.Limits).
	GuardianAlertMaxText     int `split_words:"true"`
	GuardianAlertMaxFields   int `split_words:"true"`
	GuardianAlertsPerSession int `split_words:"true"`
	// WarmPool is the warm pool's schedule (warmpool.Parse), e.g.
	// "shell=2; linux-vm=20@Mon-Fri 13:50-16:00"; empty: no pool.
	// WarmPoolTZ is the schedule's time zone (IANA name; empty: UTC),
	// WarmPoolLead how long before a window its instances are started,
	// WarmPoolTTL how long an unclaimed instance lives.
	WarmPool     string        `envconfig:"WARM_POOL"`
	WarmPoolTZ   string        `envconfig:"WARM_POOL_TZ"`
	WarmPoolLead time.Duration `envconfig:"WARM_POOL_LEAD"`
	WarmPoolTTL  time.Duration `envconfig:"WARM_POOL_TTL"`
}

// Defaults of the settings that belong to no package but the binaries.
const (
	DefaultLabsFile        = "/etc/labkeep/labs.yaml"
	DefaultHTTPAddr        = ":8080"
	DefaultAdminStatusRuns = 20
	DefaultReapDBConns     = 4
)

// DefaultConfig is every setting at its default, composed from the owning
// packages' defaults; the required settings are empty.
func DefaultConfig() Config {
	k, r, l, p := kube.DefaultConfig(), reap.DefaultConfig(), session.DefaultLimits(), lifetime.DefaultPolicy()
	tok, al := access.DefaultTokenRules(), alerts.DefaultLimits()
	return Config{
		Namespace: k.Namespace, SessionLifetime: p.Lifetime, SessionMaxLifetime: p.MaxLifetime,
		DeadlineGrace: k.DeadlineGrace, MaxConcurrentVms: l.MaxVMs, MaxConcurrentPods: l.MaxPods, LabsFile: DefaultLabsFile, LabsReload: labs.DefaultReload, HTTPAddr: DefaultHTTPAddr,
		KubeTimeout: k.CallTimeout, AnchorImage: k.AnchorImage, AnchorBackoffLimit: k.AnchorBackoffLimit,
		AnchorCompletions: k.AnchorCompletions, GuardianImage: k.GuardianImage, RetryAfter: httpapi.DefaultRetryAfter,
		CapacityWait: l.CapacityWait, CleanupTimeout: l.CleanupTimeout, QueueIdle: l.QueueIdle, ReapDryRun: r.DryRun, ReapRunDeadline: r.RunDeadline,
		ReapProvisionTimeout: r.ProvisionTimeout, ReapProvisionGrace: r.ProvisionGrace,
		JWTMaxLifetime: tok.MaxLifetime, JWTLeeway: tok.Leeway, Portal: portal.DefaultEnabled,
		KubeQPS: k.QPS, KubeBurst: k.Burst, ReapWorkers: r.Workers, AdminStatusRuns: DefaultAdminStatusRuns,
		ReapRetention: r.Retention, ReapRetentionBatch: r.RetentionBatch,
		ReapAbsentConfirm: r.AbsentConfirm, ReapDownGrace: r.DownGrace, ReapDBConns: DefaultReapDBConns,
		SSHSourceCIDRs: k.SSHSourceCIDRs, EgressBlockedCIDRs: k.EgressBlockedCIDRs, PlatformNamespace: k.PlatformNamespace,
		GuardianAlertMaxText: al.MaxText, GuardianAlertMaxFields: al.MaxFields, GuardianAlertsPerSession: al.PerSession,
		WarmPoolLead: session.DefaultPoolLead, WarmPoolTTL: session.DefaultPoolTTL,
	}
}

// PoolSchedule is the warm pool's schedule (no rules when WarmPool is
// empty).
func (c Config) PoolSchedule() (warmpool.Schedule, error) {
	loc := time.UTC
	if c.WarmPoolTZ != "" {
		l, err := time.LoadLocation(c.WarmPoolTZ)
		if err != nil {
			return warmpool.Schedule{}, fmt.Errorf("%s_WARM_POOL_TZ: %w", EnvPrefix, err)
		}
		loc = l
	}
	if c.WarmPool == "" {
		return warmpool.Schedule{Location: loc, Lead: c.WarmPoolLead}, nil
	}
	sched, err := warmpool.Parse(c.WarmPool, loc, c.WarmPoolLead)
	if err != nil {
		return sched, fmt.Errorf("%s_WARM_POOL: %w", EnvPrefix, err)
	}
	return sched, nil
}

// Policy is the lifetime policy the config describes.
func (c Config) Policy() lifetime.Policy {
	return lifetime.Policy{Lifetime: c.SessionLifetime, MaxLifetime: c.SessionMaxLifetime}
}

// Kube is the Kubernetes adapter's configuration, with the workspace Pod
// definition read from WorkspacePodFile when one is named.
func (c Config) Kube() (kube.Config, error) {
	k := kube.Config{
		Namespace: c.Namespace, Env: c.Env, MaxLifetime: c.SessionMaxLifetime, DeadlineGrace: c.DeadlineGrace,
		AnchorImage: c.AnchorImage, AnchorBackoffLimit: c.AnchorBackoffLimit, AnchorCompletions: c.AnchorCompletions,
		GuardianImage: c.GuardianImage, PlatformSSHKeys: c.PlatformSSHKeys, CallTimeout: c.KubeTimeout,
		QPS: c.KubeQPS, Burst: c.KubeBurst, SSHSourceCIDRs: c.SSHSourceCIDRs, EgressBlockedCIDRs: c.EgressBlockedCIDRs,
		GuardianWebhookURL: c.GuardianWebhookURL, GuardianAlertKey: c.AlertKey(), PlatformNamespace: c.PlatformNamespace,
	}
	if c.WorkspacePodFile != "" {
		data, err := os.ReadFile(c.WorkspacePodFile)
		if err != nil {
			return k, &setting.Error{Field: "WorkspacePod", Err: err}
		}
		k.WorkspacePod = data
	}
	return k, nil
}

// Limits are the session Service's limits.
func (c Config) Limits() session.Limits {
	return session.Limits{MaxVMs: c.MaxConcurrentVms, MaxPods: c.MaxConcurrentPods, CapacityWait: c.CapacityWait, CleanupTimeout: c.CleanupTimeout, QueueIdle: c.QueueIdle}
}

// Reap is the reaper's configuration.
func (c Config) Reap() reap.Config {
	return reap.Config{
		Rules: reap.Rules{Env: c.Env, ProvisionTimeout: c.ReapProvisionTimeout, ProvisionGrace: c.ReapProvisionGrace,
			AbsentConfirm: c.ReapAbsentConfirm, DownGrace: c.ReapDownGrace},
		DryRun: c.ReapDryRun, RunDeadline: c.ReapRunDeadline, Workers: c.ReapWorkers,
		Retention: c.ReapRetention, RetentionBatch: c.ReapRetentionBatch,
	}
}

// AlertKey derives each workspace's webhook credentials from the JWT
// secret (alerts.Key separates the two uses): no further secret to
// deploy. Rotating LABKEEP_JWT_SECRET invalidates the credentials live
// workspaces hold; their alerts are refused until those sessions end.
func (c Config) AlertKey() alerts.Key { return alerts.Key{Secret: []byte(c.JWTSecret), Env: c.Env} }

// AlertLimits bound the guardian alerts labkeep stores.
func (c Config) AlertLimits() alerts.Limits {
	return alerts.Limits{MaxText: c.GuardianAlertMaxText, MaxFields: c.GuardianAlertMaxFields, PerSession: c.GuardianAlertsPerSession}
}

// Tokens are the rules every portal token is held to.
func (c Config) Tokens() access.TokenRules {
	return access.TokenRules{Audience: c.JWTAudience, Issuer: c.JWTIssuer, MaxLifetime: c.JWTMaxLifetime, Leeway: c.JWTLeeway}
}

// variables maps each package config's Go field to the variable that
// feeds it, so a package's validation error names what the operator sets.
var variables = map[string]string{
	"Lifetime": "SESSION_LIFETIME", "MaxLifetime": "SESSION_MAX_LIFETIME",
	"Namespace": "NAMESPACE", "Env": "ENV", "DeadlineGrace": "DEADLINE_GRACE",
	"AnchorImage": "ANCHOR_IMAGE", "AnchorBackoffLimit": "ANCHOR_BACKOFF_LIMIT", "AnchorCompletions": "ANCHOR_COMPLETIONS",
	"GuardianImage": "GUARDIAN_IMAGE", "WorkspacePod": "WORKSPACE_POD_FILE", "CallTimeout": "KUBE_TIMEOUT", "QPS": "KUBE_QPS", "Burst": "KUBE_BURST",
	"MaxVMs": "MAX_CONCURRENT_VMS", "MaxPods": "MAX_CONCURRENT_PODS", "CapacityWait": "CAPACITY_WAIT", "CleanupTimeout": "CLEANUP_TIMEOUT", "QueueIdle": "QUEUE_IDLE",
	"RunDeadline": "REAP_RUN_DEADLINE", "Workers": "REAP_WORKERS",
	"Retention": "REAP_RETENTION", "RetentionBatch": "REAP_RETENTION_BATCH",
	"AbsentConfirm": "REAP_ABSENT_CONFIRM", "DownGrace": "REAP_DOWN_GRACE",
	"ProvisionTimeout": "REAP_PROVISION_TIMEOUT", "ProvisionGrace": "REAP_PROVISION_GRACE",
	"GuardianWebhookURL": "GUARDIAN_WEBHOOK_URL", "MaxText": "GUARDIAN_ALERT_MAX_TEXT",
	"MaxFields": "GUARDIAN_ALERT_MAX_FIELDS", "PerSession": "GUARDIAN_ALERTS_PER_SESSION",
}

func variable(field string) string {
	if v, ok := variables[field]; ok {
		return EnvPrefix + "_" + v
	}
	return ""
}

// tokenVariables is variables for access.TokenRules, kept apart because
// its field names (MaxLifetime) repeat the session policy's.
var tokenVariables = map[string]string{
	"Audience": "JWT_AUDIENCE", "Issuer": "JWT_ISSUER", "MaxLifetime": "JWT_MAX_LIFETIME", "Leeway": "JWT_LEEWAY",
}

func tokenVariable(field string) string { return EnvPrefix + "_" + tokenVariables[field] }

// MinSchedulerTokenBytes is the shortest LABKEEP_SCHEDULER_TOKEN accepted:
// it is the only credential of an endpoint that deletes things.
const MinSchedulerTokenBytes = 16

// Validate checks every setting through the owning package's Validate, plus
// the rules that span packages; every message names the variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s_%s: %s", EnvPrefix, name, fmt.Sprintf(format, args...)))
	}
	k, kerr := c.Kube()
	if kerr == nil {
		kerr = k.Validate()
	}
	for _, err := range []error{c.Policy().Validate(), kerr, c.Limits().Validate(), c.Reap().Validate(), c.AlertLimits().Validate()} {
		if err = setting.Rename(err, variable); err != nil {
			errs = append(errs, err)
		}
	}
	if err := setting.Rename(c.Tokens().Validate(), tokenVariable); err != nil {
		errs = append(errs, err)
	}
	if len(c.SSHAuthorizedKeys) > 0 {
		bad("SSH_AUTHORIZED_KEYS", "was renamed LABKEEP_PLATFORM_SSH_KEYS (platform keys, authorized on every session; students get keys of their own)")
	}
	if _, err := c.PoolSchedule(); err != nil {
		errs = append(errs, err)
	}
	if c.WarmPoolTTL <= 0 {
		bad("WARM_POOL_TTL", "must be positive, got %s", c.WarmPoolTTL)
	}
	if c.WarmPoolLead < 0 {
		bad("WARM_POOL_LEAD", "must not be negative, got %s", c.WarmPoolLead)
	}
	if c.DatabaseURL == "" {
		bad("DATABASE_URL", "is required")
	}
	if c.SchedulerToken == "" {
		bad("SCHEDULER_TOKEN", "is required: without it scheduled reaper runs cannot authenticate and nothing expires")
	} else if len(c.SchedulerToken) < MinSchedulerTokenBytes {
		bad("SCHEDULER_TOKEN", "must be at least %d bytes, got %d", MinSchedulerTokenBytes, len(c.SchedulerToken))
	}
	if len(c.JWTSecret) < 32 {
		bad("JWT_SECRET", "must be at least 32 bytes, got %d", len(c.JWTSecret))
	}
	if c.LabsFile == "" {
		bad("LABS_FILE", "is required")
	}
	if c.LabsReload < 0 {
		bad("LABS_RELOAD", "must not be negative (0: read only at start), got %s", c.LabsReload)
	}
	if c.HTTPAddr == "" {
		bad("HTTP_ADDR", "is required")
	}
	if c.MetricsAddr != "" && c.MetricsAddr == c.HTTPAddr {
		bad("METRICS_ADDR", "must differ from LABKEEP_HTTP_ADDR %s: /metrics is kept off the public listener", c.HTTPAddr)
	}
	if c.RetryAfter <= 0 {
		bad("RETRY_AFTER", "must be positive, got %s", c.RetryAfter)
	}
	if c.AdminStatusRuns < 1 {
		bad("ADMIN_STATUS_RUNS", "must be at least 1, got %d", c.AdminStatusRuns)
	}
	if c.DBMaxConns < 0 {
		bad("DB_MAX_CONNS", "must not be negative (0: the DSN's or pgxpool's default), got %d", c.DBMaxConns)
	}
	if c.ReapDBConns < 1 {
		bad("REAP_DB_CONNS", "must be at least 1, got %d", c.ReapDBConns)
	}
	if c.CapacityWait >= c.ReapProvisionGrace {
		bad("CAPACITY_WAIT", "%s must be below LABKEEP_REAP_PROVISION_GRACE %s, or the reaper fails opens still queued for capacity", c.CapacityWait, c.ReapProvisionGrace)
	}
	return errors.Join(errs...)
}

// App is the wired application. Close releases the database pool.
type App struct {
	Config   Config
	Store    *pgstore.PG
	Cluster  *kube.Cluster
	Labs     *labs.Live
	Sessions *session.Service
	// API serves the session endpoints; mount more routes in front of it.
	API *httpapi.API
	// Reaper is reapTick and adminReapNow.
	Reaper *reap.Reaper
	// ReapStore is the reaper's store: Store's database on a pool of its
	// own (LABKEEP_REAP_DB_CONNS).
	ReapStore *pgstore.PG
	// Metrics is the registry behind /metrics.
	Metrics *prometheus.Registry
	// Kube is the rest config used, for other adapters.
	Kube *rest.Config
	// Portal is the student page (nil unless Config.Portal); add handlers
	// under it with Portal.Handle.
	Portal *portal.Portal

	handler http.Handler
	// stop ends the lab catalog's watcher.
	stop context.CancelFunc
}

// Option changes how Build connects, for the local stack and tests; a
// production binary passes none.
type Option func(*options)

type options struct {
	wrapTransport func(http.RoundTripper) http.RoundTripper
}

// WrapTransport puts wrap around the Kubernetes client's transport (fault
// injection and request counting in tests).
func WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) Option {
	return func(o *options) { o.wrapTransport = wrap }
}

// Build validates cfg and connects everything. now is the clock (time.Now
// in production). Errors name the setting at fault where there is one.
func Build(ctx context.Context, cfg Config, now func() time.Time, log *slog.Logger, opts ...Option) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	auth, err := cfg.Tokens().Authenticator([]byte(cfg.JWTSecret), now)
	if err != nil {
		return nil, setting.Rename(err, tokenVariable)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	catalog, err := labs.OpenLive(cfg.LabsFile, log, labs.NewMetrics(reg))
	if err != nil {
		return nil, fmt.Errorf("%s_LABS_FILE: %w", EnvPrefix, err)
	}
	rc, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if o.wrapTransport != nil {
		rc.Wrap(o.wrapTransport)
	}
	kcfg, err := cfg.Kube()
	if err != nil {
		return nil, setting.Rename(err, variable)
	}
	cluster, err := kube.NewForConfig(kcfg, rc)
	if err != nil {
		return nil, err
	}
	store, err := pgstore.Open(ctx, cfg.DatabaseURL, cfg.Env, pgstore.MaxConns(cfg.DBMaxConns))
	if err != nil {
		return nil, fmt.Errorf("%s_DATABASE_URL: %w", EnvPrefix, err)
	}
	reapStore, err := store.WithPool(ctx, cfg.ReapDBConns)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("%s_REAP_DB_CONNS: %w", EnvPrefix, err)
	}
	svc := &session.Service{
		Store: store, Cluster: cluster, Labs: catalog, Policy: cfg.Policy(),
		Limits: cfg.Limits(), Waitlist: store, Now: now, Log: log,
	}
	api := httpapi.New(httpapi.Options{
		Sessions: svc, Auth: auth,
		Now: now, Log: log, RetryAfter: cfg.RetryAfter,
	})
	svc.Metrics = session.NewMetrics(reg, store)
	reg.MustRegister(svc.QueueCollector(), svc.PoolCollector())
	var public prometheus.Gatherer = reg
	if cfg.MetricsAddr != "" {
		public = nil // served on its own address only
	}
	reaper := &reap.Reaper{
		Store: reapStore, Cluster: cluster, Now: now, Log: log, Metrics: reap.NewMetrics(reg),
		Config: cfg.Reap(), Waitlist: svc,
	}
	if sched, _ := cfg.PoolSchedule(); len(sched.Rules) > 0 {
		if err := sched.Check(func(lab string) bool { _, ok := catalog.Get(lab); return ok }); err != nil {
			store.Close()
			reapStore.Close()
			return nil, fmt.Errorf("%s_WARM_POOL: %w", EnvPrefix, err)
		}
		svc.Pool = &session.WarmPool{Schedule: sched, TTL: cfg.WarmPoolTTL, Store: store, Cluster: cluster}
		reaper.Pools = svc
	}
	a := &App{Config: cfg, Store: store, Cluster: cluster, Labs: catalog, Sessions: svc, API: api, Kube: rc, Reaper: reaper, Metrics: reg, ReapStore: reapStore}
	// The preview is the same reaper deleting nothing; its run is
	// recorded as a dry run.
	preview := *reaper
	preview.Config.DryRun = true
	a.handler = api.WithAdmin(httpapi.AdminOptions{
		Alerts: store, Limits: cfg.AlertLimits(), Key: cfg.AlertKey(),
	}, api.WithReaper(httpapi.ReaperOptions{
		Reaper: reaper, DryRun: &preview, SchedulerToken: cfg.SchedulerToken, Gatherer: public,
		Status: func(ctx context.Context) (reap.Status, error) {
			return reaper.ReadStatus(ctx, store, cluster, cfg.AdminStatusRuns, cfg.MaxConcurrentVms)
		},
	}))
	// The web terminal and cleanup button (WebSocket: on-prem only).
	term, err := terminal.New(terminal.Options{Sessions: svc, Auth: auth, API: api, Kube: rc, Exec: kube.WorkspaceExecutor, Namespace: cfg.Namespace, Now: now, Log: log})
	if err != nil {
		return nil, err
	}
	a.handler = term.Mount(a.handler)
	if cfg.LabsReload > 0 {
		watch, stop := context.WithCancel(context.WithoutCancel(ctx))
		ticker := time.NewTicker(cfg.LabsReload)
		a.stop = func() { stop(); ticker.Stop() }
		go catalog.Watch(watch, ticker.C)
	}
	if cfg.Portal {
		a.Portal = portal.New()
		a.Portal.Handle("terminal", terminal.Page())
		a.handler = a.Portal.Mount(a.handler)
	}
	a.handler = httpapi.NewHTTPMetrics(reg).Instrument(a.handler)
	return a, nil
}

// Handler is the http.Handler every platform serves: the session
// endpoints and the reaper's.
func (a *App) Handler() http.Handler { return a.handler }

// Close releases the database pools.
func (a *App) Close() {
	if a.stop != nil {
		a.stop()
	}
	a.ReapStore.ClosePool()
	a.Store.Close()
}

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
