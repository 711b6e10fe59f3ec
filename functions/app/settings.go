package app

import (
	"errors"
	"fmt"
	"os"
	"time"

	"labkeep/shared/access"
	"labkeep/shared/alerts"
	"labkeep/shared/httpapi"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/portal"
	"labkeep/shared/reap"
	"labkeep/shared/reservation"
	"labkeep/shared/seating"
	"labkeep/shared/session"
	"labkeep/shared/setting"
	"labkeep/shared/termlimit"
	"labkeep/shared/warmpool"
	"labkeep/shared/workspacekey"
)

// EnvPrefix is the prefix of every setting's variable (LABKEEP_…).
const EnvPrefix = "LABKEEP"

// Config is every setting of the session functions. The settings of a
// package live in that package's own configuration (Policy, Kube, Limits,
// Reap, Tokens, Alerts, Terminal, OpenRate), whose defaults are the package's; the rest belong
// to the binaries. Settings lists the variable that fills each field. The
// five required settings (env, database URL, JWT secret, workspace key,
// scheduler token) have no default; Validate names each one that is
// missing.
//
// A few package fields are not settings of their own but copies of one:
// Kube.Env and Reap.Env are Env, Kube.MaxLifetime is Policy.MaxLifetime,
// Kube.WorkspaceKey is WorkspaceKey() and Kube.WorkspacePod the contents
// of WorkspacePodFile; Validate and Build fill them (resolve), so a Config
// built in code sets each setting once.
type Config struct {
	Env         string
	DatabaseURL string
	JWTSecret   string
	// WorkspaceSecret is the workspace key's secret (WorkspaceKey).
	WorkspaceSecret string
	SchedulerToken  string

	Policy lifetime.Policy
	Kube   kube.Config
	Limits seating.Limits
	Reap   reap.Config
	Tokens access.TokenRules
	Alerts alerts.Limits
	// Terminal bounds the web terminal (on-prem server only).
	Terminal termlimit.Limits
	// Reservations are the timings of courses' reserved seats.
	Reservations reservation.Rules
	// OpenRate bounds each student's opens that write a row.
	OpenRate session.OpenRate

	Kubeconfig       string
	WorkspacePodFile string
	LabsFile         string
	LabsReload       time.Duration
	HTTPAddr         string
	MetricsAddr      string
	MetricsToken     string
	RetryAfter       time.Duration
	DBMaxConns       int
	ReapDBConns      int
	AdminStatusRuns  int
	Portal           bool
	// SSHAuthorizedKeys is read only to be refused (see Validate).
	SSHAuthorizedKeys []string

	WarmPool     string
	WarmPoolTZ   string
	WarmPoolLead time.Duration
	WarmPoolTTL  time.Duration
}

// Defaults of the settings that belong to no package but the binaries.
const (
	DefaultLabsFile        = "/etc/labkeep/labs.yaml"
	DefaultHTTPAddr        = ":8080"
	DefaultAdminStatusRuns = 20
	DefaultReapDBConns     = 4
)

// DefaultConfig is every setting at its default: each package's
// configuration is that package's default; the required settings are
// empty.
func DefaultConfig() Config {
	return Config{
		Policy: lifetime.DefaultPolicy(), Kube: kube.DefaultConfig(), Limits: seating.DefaultLimits(),
		Reap: reap.DefaultConfig(), Tokens: access.DefaultTokenRules(), Alerts: alerts.DefaultLimits(), Terminal: termlimit.DefaultLimits(),
		Reservations: reservation.DefaultRules(), OpenRate: session.DefaultOpenRate,
		LabsFile: DefaultLabsFile, LabsReload: labs.DefaultReload, HTTPAddr: DefaultHTTPAddr,
		RetryAfter: httpapi.DefaultRetryAfter, ReapDBConns: DefaultReapDBConns, AdminStatusRuns: DefaultAdminStatusRuns,
		Portal: portal.DefaultEnabled, WarmPoolLead: seating.DefaultPoolLead, WarmPoolTTL: seating.DefaultPoolTTL,
	}
}

// Settings is c's settings table: every LABKEEP_* variable, bound to the
// field of c it fills. It is the one place a variable is named: reading
// the environment (Read), naming a setting in an error (KeyOf, Rename) and
// the settings reference in functions/README.md (Markdown) all come from
// it.
func (c *Config) Settings() setting.Table {
	k, r, l, tl := &c.Kube, &c.Reap, &c.Limits, &c.Terminal
	return setting.Table{Prefix: EnvPrefix, Vars: []setting.Var{
		setting.String("ENV", "(required) environment name; labels every object (`labkeep.io/env`) and namespaces the advisory locks; "+
			"the first labkeep to migrate a database records it there (table `environment`), and a labkeep of another environment "+
			"refuses that database at start, naming both", &c.Env).Feeds(&k.Env, &r.Env),
		setting.String("DATABASE_URL", "(required) PostgreSQL DSN; one database per environment (a database migrated before it "+
			"recorded its environment becomes the environment of the first labkeep that opens it: upgrade each environment against its own database first)",
			&c.DatabaseURL),
		setting.String("JWT_SECRET", "(required, ≥ 32 bytes) the portal's shared HS256 secret", &c.JWTSecret),
		setting.String("WORKSPACE_KEY", "(required, ≥ 32 bytes, not the JWT secret) the key each workspace's own credentials are "+
			"derived from (HMACs of the session): its guardian's alert webhook credentials and cleanup token; rotating it "+
			"invalidates those of live workspaces", &c.WorkspaceSecret).Feeds(&k.WorkspaceKey),
		setting.String("JWT_AUDIENCE", "when set, every token must carry this `aud` (one of its values)", &c.Tokens.Audience),
		setting.String("JWT_ISSUER", "when set, every token must carry this `iss`", &c.Tokens.Issuer),
		setting.String("JWT_COURSES_CLAIM", "the claim listing the courses a student is a member of, or an instructor teaches (a list of strings, or one string); empty reads none", &c.Tokens.CoursesClaim),
		setting.Duration("RESERVATION_LEAD", "a course's reserved seats are held from this long before its window starts, so that labs opened just before do not take them", &c.Reservations.Lead),
		setting.Duration("RESERVATION_RELEASE", "reserved seats nobody took this long after the window's start are released to everyone", &c.Reservations.Release),
		setting.Duration("RESERVATION_MAX_LENGTH", "the longest window a reservation may have", &c.Reservations.MaxLength),
		setting.Duration("RESERVATION_MAX_AHEAD", "how far ahead a reservation may start", &c.Reservations.MaxAhead),
		setting.Duration("JWT_MAX_LIFETIME", "longest a token may be valid: `exp − iat` (the life its issuer gave it, the same at "+
			"every check), or for a token without `iat` `exp − now` (no issue time to measure from, so what it has left is bounded)",
			&c.Tokens.MaxLifetime),
		setting.Duration("JWT_LEEWAY", "clock skew tolerated in the `exp`, `nbf` and `iat` checks (an `iat` or `nbf` further in the "+
			"future is refused) and in `exp − now`; `0` to `5m`", &c.Tokens.Leeway),
		setting.String("SCHEDULER_TOKEN", "(required, ≥ 16 bytes) scheduler's bearer token for `/reapTick`; without it nothing "+
			"would ever be reaped on schedule", &c.SchedulerToken),
		setting.String("NAMESPACE", "where session objects live", &k.Namespace),
		setting.Duration("SESSION_LIFETIME", "session lifetime", &c.Policy.Lifetime),
		setting.Duration("SESSION_MAX_LIFETIME", "extension cap", &c.Policy.MaxLifetime).Feeds(&k.MaxLifetime),
		setting.Duration("DEADLINE_GRACE", "anchor deadline = max lifetime + grace", &k.DeadlineGrace),
		setting.String("ANCHOR_IMAGE", "image of the deadline anchor Job", &k.AnchorImage),
		setting.Int("ANCHOR_BACKOFF_LIMIT", "real failures of the anchor's Pod it survives (drains, evictions and node loss never count)",
			&k.AnchorBackoffLimit),
		setting.Int("ANCHOR_COMPLETIONS", "endings of the anchor's Pod it survives, each replaced", &k.AnchorCompletions),
		setting.String("GUARDIAN_IMAGE", "the workspace Pod's guardian sidecar", &k.GuardianImage),
		setting.String("WORKSPACE_POD_FILE", "a workspace Pod definition to use instead of the built-in "+
			"`infra/guardian/workspace-pod.yaml` (tolerations, node selectors, capabilities a platform's nodes cannot grant)",
			&c.WorkspacePodFile).Feeds(&k.WorkspacePod),
		setting.Int("MAX_CONCURRENT_VMS", "live VMs in the namespace, ≥ 1 (keep `infra/base/resourcequota.yaml` equal)", &l.MaxVMs),
		setting.Int("MAX_CONCURRENT_PODS", "live workspace Pods (pod labs: every unfinished Pod with a deadline) in the namespace, ≥ 1, "+
			"counted under the same capacity lock as VMs (keep the `labkeep-workspaces` quota equal)", &l.MaxPods),
		setting.Duration("QUEUE_IDLE", "how long a waitlist entry nobody polls (`getSession`) keeps its place", &l.QueueIdle),
		setting.String("WARM_POOL", "warm pool schedule, e.g. `shell=2; linux-vm=20@Mon-Fri 13:50-16:00`: per lab, ready instances "+
			"an open (or the head of the line) claims instead of provisioning cold; they count against the same capacity; empty: no pool",
			&c.WarmPool),
		setting.String("WARM_POOL_TZ", "time zone of the schedule's windows (IANA name; empty: UTC)", &c.WarmPoolTZ),
		setting.Duration("WARM_POOL_LEAD", "how long before a window its instances are started (0 to 24h)", &c.WarmPoolLead),
		setting.Duration("WARM_POOL_TTL", "how long an unclaimed instance lives before it is replaced", &c.WarmPoolTTL),
		setting.Duration("CLEANUP_TIMEOUT", "bound of the rollback after a failed open (runs even if the request was cancelled)",
			&l.CleanupTimeout),
		setting.Duration("CAPACITY_WAIT", "longest an open queues for the capacity lock before 503 `no_capacity`; must be below "+
			"the reaper's provision grace", &l.CapacityWait),
		setting.Duration("RETRY_AFTER", "the Retry-After sent with 503 `no_capacity` and 429 `too_many_terminals`", &c.RetryAfter),
		setting.String("LABS_FILE", "lab templates", &c.LabsFile),
		setting.Duration("LABS_RELOAD", "how often the lab templates file is re-read (`0`: only at start); an invalid one is refused "+
			"(logged, `labkeep_lab_catalog_reload_failures_total`) and the last good catalog stays; running sessions keep the lab "+
			"they were opened with", &c.LabsReload),
		setting.String("HTTP_ADDR", "listen address", &c.HTTPAddr),
		setting.String("METRICS_ADDR", "`labkeep-http` serves `GET /metrics` on this address only, apart from the public handler, "+
			"which then has none; empty keeps `/metrics` on the public handler (Lambda, Cloud Functions)", &c.MetricsAddr),
		setting.String("METRICS_TOKEN", "(≥ 16 bytes) the bearer token `/metrics` requires wherever it is served; without it "+
			"`/metrics` on the public handler refuses every call (a scrape reads the database), and `LABKEEP_METRICS_ADDR`'s "+
			"listener, which only the cluster reaches, answers without one", &c.MetricsToken),
		setting.Bool("REAP_DRY_RUN", "report what would be deleted, delete nothing", &r.DryRun),
		setting.Duration("REAP_RUN_DEADLINE", "bound of one reaper run (below the 1-minute period)", &r.RunDeadline),
		setting.Duration("REAP_PROVISION_TIMEOUT", "a session still provisioning after this is a ghost", &r.ProvisionTimeout),
		setting.Duration("REAP_PROVISION_GRACE", "how long a provisioning session may lack its VM (the row is written before "+
			"the objects); at most the provision timeout", &r.ProvisionGrace),
		setting.Int("REAP_WORKERS", "items handled at once in a run", &r.Workers),
		setting.Int("DB_MAX_CONNS", "how many database connections student calls use; `0` keeps the DSN's "+
			"`pool_max_conns`, or pgxpool's default (the larger of 4 and the number of CPUs)", &c.DBMaxConns),
		setting.Int("REAP_DB_CONNS", "the reaper's own database connections (≥ 1): its workers wait for these, never for the connections "+
			"student calls need", &c.ReapDBConns),
		setting.Duration("REAP_ABSENT_CONFIRM", "a running session whose VMI or workspace Pod is missing is a ghost only when a "+
			"later run, at least this long after the first that missed it, still misses it", &r.AbsentConfirm),
		setting.Duration("REAP_DOWN_GRACE", "a running session whose VM is reported down or whose workspace Pod has ended is a "+
			"ghost once runs have seen it so this long", &r.DownGrace),
		setting.Duration("REAP_HOME_RETENTION", "a student's home (labs that keep a `home`) that no session has held for this long is "+
			"deleted by the reaper, the dry run listing it first (≥ 168h; `0` keeps homes for ever)", &r.HomeRetention),
		setting.Duration("REAP_RETENTION", "reaper run records older than this are deleted by the reaper (≥ 24h)", &r.Retention),
		setting.Duration("REAP_REFUSED_RETENTION", "rows of opens refused for lack of capacity (503 `no_capacity`) older than this are deleted by the "+
			"reaper, not in a dry run (≥ 1h and ≥ `OPENS_WINDOW`: the open rate counts them)", &r.RefusedRetention),
		setting.Int("REAP_RETENTION_BATCH", "at most this many old run records, and as many refused opens, deleted per run (≥ 1)", &r.RetentionBatch),
		setting.Int("ADMIN_STATUS_RUNS", "how many recent runs `GET /adminStatus` shows", &c.AdminStatusRuns),
		setting.Quantity("HOME_TOTAL", "the most one student's homes (labs that keep a `home`) may hold together in this environment: "+
			"an open that would make a new home past it is refused with 409 `home_quota`", &k.HomeTotal),
		setting.String("HOME_STORAGE_CLASS", "StorageClass of students' homes ; empty: the cluster's default (the admission policy admits a home only of a class its `homeStorageClasses` lists)", &k.HomeStorageClass),
		setting.String("HOME_READER_IMAGE", "image of the Pod that reads a home no session holds for its download (sleep and tar with gzip; in the admission policy's `images`)", &k.HomeReaderImage),
		setting.Duration("KUBE_TIMEOUT", "bound of every single Kubernetes API call", &k.CallTimeout),
		setting.Float32("KUBE_QPS", "client-side rate limit towards the API server, requests per second", &k.QPS),
		setting.Int("KUBE_BURST", "client-side burst towards the API server", &k.Burst),
		setting.String("KUBECONFIG", "kubeconfig for Lambda / Cloud Functions; empty: in-cluster credentials", &c.Kubeconfig),
		setting.List("PLATFORM_SSH_KEYS", "comma-separated platform/grader public keys authorized on every node of every session; "+
			"never for students", &k.PlatformSSHKeys),
		setting.List("SSH_AUTHORIZED_KEYS", "the old name of the platform keys: refused, so a deployment that still sets it stops "+
			"with a message instead of silently losing its grader key", &c.SSHAuthorizedKeys),
		setting.Bool("PORTAL", "serve the student page under `/portal/` beside the functions (`false` where the page is hosted "+
			"elsewhere)", &c.Portal),
		setting.List("SSH_SOURCE_CIDRS", "where students' SSH reaches the labs from (the internet, or the range of the SSH ingress "+
			"in front); the blocked ranges inside these stay blocked", &k.SSHSourceCIDRs),
		setting.String("GUARDIAN_WEBHOOK_URL", "labkeep's `POST /guardianAlert` as workspace Pods reach it; each new workspace "+
			"Pod's guardian gets it with its session's credentials (none: the definition's `GUARDIAN_WEBHOOK_URL` stays)",
			&k.GuardianWebhookURL),
		setting.Int("GUARDIAN_ALERT_MAX_TEXT", "bytes of each alert text labkeep accepts (keep ≥ guardian's `GUARDIAN_ALERT_MAX_TEXT`)",
			&c.Alerts.MaxText),
		setting.Int("GUARDIAN_ALERT_MAX_FIELDS", "fields per alert labkeep accepts (keep ≥ guardian's `GUARDIAN_ALERT_MAX_FIELDS`)",
			&c.Alerts.MaxFields),
		setting.Int("GUARDIAN_ALERTS_PER_SESSION", "alerts a session keeps, the newest", &c.Alerts.PerSession),
		setting.Int("GUARDIAN_ALERTS_PER_WINDOW", "alerts a session's workspace may post per `GUARDIAN_ALERTS_WINDOW` (≤ the alerts "+
			"a session keeps; 0: no bound); past it 429 `too_many_alerts` with `Retry-After`, nothing stored", &c.Alerts.PerWindow),
		setting.Duration("GUARDIAN_ALERTS_WINDOW", "the sliding window `GUARDIAN_ALERTS_PER_WINDOW` counts in", &c.Alerts.Window),
		setting.Duration("GUARDIAN_ALERTS_AFTER_END", "how long after its session ended a workspace's alerts are still taken "+
			"(guardian's last, while its Pod is deleted); later its credentials are refused (401)", &c.Alerts.AfterEnd),
		setting.List("EGRESS_BLOCKED_CIDRS", "ranges a lab never reaches (the cluster's Pod, Service and node ranges: add yours if "+
			"they are public); link-local (`169.254.0.0/16`, the cloud metadata service; `fe80::/10`) is always blocked",
			&k.EgressBlockedCIDRs),
		setting.String("PLATFORM_NAMESPACE", "the functions' namespace: its Pods alone may reach guardian's API port of a workspace "+
			"Pod (the terminal's cleanup button); empty: none may", &k.PlatformNamespace),
		setting.List("PLATFORM_SOURCE_CIDRS", "ranges the functions' calls reach guardian's API from where they do not run as Pods "+
			"of `PLATFORM_NAMESPACE` (a cloud's fixed egress address, the local stack's host), blocked ranges included", &k.PlatformSourceCIDRs),
		setting.String("CLUSTER_DNS", "the cluster's DNS Pods, `namespace/key=value[,key=value]`: the only resolver a lab may ask",
			&k.ClusterDNS),
		setting.Int("TERMINALS_PER_STUDENT", "web terminals (`/terminal/connect`, on-prem server) a student holds open at once in one "+
			"server process, ≥ 1; the next is refused 429 `too_many_terminals` (a close with 4429 after the upgrade)", &tl.PerStudent),
		setting.Int("TERMINALS_PER_PROCESS", "web terminal sockets one server process holds at once, ≥ 1: open terminals and sockets "+
			"still waiting for their token together, so a flood of sockets that never authenticate cannot take more; the next is "+
			"refused as past a student's cap", &tl.PerProcess),
		setting.Duration("TERMINAL_AUTH_TIMEOUT", "how long a new terminal socket may take to send its token before it is dropped",
			&tl.AuthTimeout),
		setting.Duration("TERMINAL_IDLE", "a terminal whose client sent no input this long is closed (output does not count), "+
			"its reason starting `idle`", &tl.Idle),
		setting.Duration("TERMINAL_MAX_LIFETIME", "a terminal open this long is closed, typing or not, its reason starting `lifetime`",
			&tl.MaxLifetime),
		setting.Duration("TERMINAL_RECHECK", "how often an open terminal re-reads its session (`getSession`'s read): it closes "+
			"within about this long of its session ending (closed, expired, reaped)", &tl.Recheck),
		setting.Int("OPENS_PER_STUDENT", "opens a student may make per `OPENS_WINDOW` that write a session row (refused for no "+
			"capacity, failed or started; an answer with their live session or place in line is not one); past it `openSession` "+
			"answers 429 `too_many_opens` with `Retry-After` and writes nothing; 0: no bound", &c.OpenRate.Max),
		setting.Duration("OPENS_WINDOW", "the sliding window `OPENS_PER_STUDENT` counts in", &c.OpenRate.Per),
	}}
}

// FromEnv is DefaultConfig with every variable lookup (os.LookupEnv)
// finds read over it, as every binary starts; a value that does not parse
// is an error naming its variable.
func FromEnv(lookup func(string) (string, bool)) (Config, error) {
	c := DefaultConfig()
	t := c.Settings()
	return c, t.Read(lookup)
}

// named is err as the setting that fills field (a pointer into c) names it.
func (c *Config) named(field any, err error) error {
	return &setting.Error{Field: c.Settings().KeyOf(field), Err: err}
}

// resolve is c with the package fields that copy a setting filled (see
// Config), the workspace Pod definition read from WorkspacePodFile when one
// is named.
func (c Config) resolve() (Config, error) {
	c.Kube.Env, c.Reap.Env = c.Env, c.Env
	c.Kube.MaxLifetime = c.Policy.MaxLifetime
	c.Kube.WorkspaceKey = c.WorkspaceKey()
	if c.WorkspacePodFile != "" {
		data, err := os.ReadFile(c.WorkspacePodFile)
		if err != nil {
			return c, c.named(&c.WorkspacePodFile, err)
		}
		c.Kube.WorkspacePod = data
	}
	return c, nil
}

// PoolSchedule is the warm pool's schedule (no rules when WarmPool is
// empty); warmpool.Parse holds every rule, the lead's included.
func (c *Config) PoolSchedule() (warmpool.Schedule, error) {
	loc := time.UTC
	if c.WarmPoolTZ != "" {
		l, err := time.LoadLocation(c.WarmPoolTZ)
		if err != nil {
			return warmpool.Schedule{}, c.named(&c.WarmPoolTZ, err)
		}
		loc = l
	}
	if err := warmpool.CheckLead(c.WarmPoolLead); err != nil {
		return warmpool.Schedule{}, c.named(&c.WarmPoolLead, err)
	}
	sched, err := warmpool.Parse(c.WarmPool, loc, c.WarmPoolLead)
	if err != nil {
		return sched, c.named(&c.WarmPool, err)
	}
	return sched, nil
}

// WorkspaceKey derives each workspace's own credentials (shared/workspacekey)
// from WorkspaceSecret, a secret of its own: a workspace's root can read
// its own credentials, and whoever holds the JWT secret mints every
// student's and admin's token, so the two are never one. Rotating it
// invalidates the credentials live workspaces hold: their alerts and
// cleanups are refused until those sessions end.
func (c Config) WorkspaceKey() workspacekey.Key {
	return workspacekey.Key{Secret: []byte(c.WorkspaceSecret), Env: c.Env}
}

// AlertKey is WorkspaceKey as the alert webhook's credentials.
func (c Config) AlertKey() alerts.Key { return alerts.Key(c.WorkspaceKey()) }

// MinBearerTokenBytes is the shortest static bearer token accepted, the
// scheduler's and the metrics scraper's: each is the only credential of
// its endpoint (reapTick deletes things; a scrape reads the database).
const MinBearerTokenBytes = 16

// MinJWTSecretBytes is the shortest JWT secret accepted.
const MinJWTSecretBytes = 32

// Validate checks every setting through the owning package's Validate, plus
// the rules that span packages; every message names the variable.
func (c Config) Validate() error {
	r, rerr := c.resolve()
	t := r.Settings()
	key := t.KeyOf
	var errs []error
	bad := func(field any, format string, args ...any) {
		errs = append(errs, r.named(field, fmt.Errorf(format, args...)))
	}
	if rerr != nil {
		errs = append(errs, rerr)
	} else {
		errs = append(errs, t.Rename(r.Kube.Validate(), &r.Kube))
	}
	errs = append(errs,
		t.Rename(r.Policy.Validate(), &r.Policy), t.Rename(r.Limits.Validate(), &r.Limits),
		t.Rename(r.Reap.Validate(), &r.Reap), t.Rename(r.Alerts.Validate(), &r.Alerts),
		t.Rename(r.Tokens.Validate(), &r.Tokens), t.Rename(r.Terminal.Validate(), &r.Terminal),
		t.Rename(r.OpenRate.Validate(), &r.OpenRate), t.Rename(r.Reservations.Validate(), &r.Reservations))
	if len(r.SSHAuthorizedKeys) > 0 {
		bad(&r.SSHAuthorizedKeys, "was renamed %s (platform keys, authorized on every session; students get keys of their own)",
			key(&r.Kube.PlatformSSHKeys))
	}
	if _, err := r.PoolSchedule(); err != nil {
		errs = append(errs, err)
	}
	if r.WarmPoolTTL <= 0 {
		bad(&r.WarmPoolTTL, "must be positive, got %s", r.WarmPoolTTL)
	}
	if r.DatabaseURL == "" {
		bad(&r.DatabaseURL, "is required")
	}
	if r.SchedulerToken == "" {
		bad(&r.SchedulerToken, "is required: without it scheduled reaper runs cannot authenticate and nothing expires")
	} else if len(r.SchedulerToken) < MinBearerTokenBytes {
		bad(&r.SchedulerToken, "must be at least %d bytes, got %d", MinBearerTokenBytes, len(r.SchedulerToken))
	}
	if len(r.JWTSecret) < MinJWTSecretBytes {
		bad(&r.JWTSecret, "must be at least %d bytes, got %d", MinJWTSecretBytes, len(r.JWTSecret))
	}
	switch {
	case len(r.WorkspaceSecret) < workspacekey.MinSecretBytes:
		bad(&r.WorkspaceSecret, "must be at least %d bytes, got %d", workspacekey.MinSecretBytes, len(r.WorkspaceSecret))
	case r.WorkspaceSecret == r.JWTSecret:
		bad(&r.WorkspaceSecret, "must not be %s: a workspace's root reads its own credentials, and the JWT secret mints "+
			"every student's token", key(&r.JWTSecret))
	}
	if r.LabsFile == "" {
		bad(&r.LabsFile, "is required")
	}
	if r.LabsReload < 0 {
		bad(&r.LabsReload, "must not be negative (0: read only at start), got %s", r.LabsReload)
	}
	if r.HTTPAddr == "" {
		bad(&r.HTTPAddr, "is required")
	}
	if r.MetricsAddr != "" && r.MetricsAddr == r.HTTPAddr {
		bad(&r.MetricsAddr, "must differ from %s %s: /metrics is kept off the public listener", key(&r.HTTPAddr), r.HTTPAddr)
	}
	if r.OpenRate.Max > 0 && r.Reap.RefusedRetention < r.OpenRate.Per {
		bad(&r.Reap.RefusedRetention, "%s is below %s %s: the open rate counts refused opens of the whole window", r.Reap.RefusedRetention,
			key(&r.OpenRate.Per), r.OpenRate.Per)
	}
	if r.MetricsToken != "" && len(r.MetricsToken) < MinBearerTokenBytes {
		bad(&r.MetricsToken, "must be at least %d bytes, got %d", MinBearerTokenBytes, len(r.MetricsToken))
	}
	if r.RetryAfter <= 0 {
		bad(&r.RetryAfter, "must be positive, got %s", r.RetryAfter)
	}
	if r.AdminStatusRuns < 1 {
		bad(&r.AdminStatusRuns, "must be at least 1, got %d", r.AdminStatusRuns)
	}
	if r.DBMaxConns < 0 {
		bad(&r.DBMaxConns, "must not be negative (0: the DSN's or pgxpool's default), got %d", r.DBMaxConns)
	}
	if r.ReapDBConns < 1 {
		bad(&r.ReapDBConns, "must be at least 1, got %d", r.ReapDBConns)
	}
	if r.Limits.CapacityWait >= r.Reap.ProvisionGrace {
		bad(&r.Limits.CapacityWait, "%s must be below %s %s, or the reaper fails opens still queued for capacity",
			r.Limits.CapacityWait, key(&r.Reap.ProvisionGrace), r.Reap.ProvisionGrace)
	}
	return errors.Join(errs...)
}
