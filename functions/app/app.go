// Package app wires labkeep's session functions from one Config: the
// PostgreSQL store, the Kubernetes adapter, the lab catalog, the Service
// and its HTTP handler. Every platform entry point (the Knative/on-prem
// server, the Lambda and Cloud Functions shims) reads Config with FromEnv
// and calls Build, so all three run identical code.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"labkeep/shared/httpapi"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/pgstore"
	"labkeep/shared/portal"
	"labkeep/shared/reap"
	"labkeep/shared/reservation"
	"labkeep/shared/seating"
	"labkeep/shared/session"
	"labkeep/shared/terminal"
)

// The session functions' consumers take the small interfaces they
// declare; session.Service and kube.Cluster are what Build hands them.
var (
	_ httpapi.Sessions  = (*session.Service)(nil)
	_ terminal.Sessions = (*session.Service)(nil)
	_ terminal.Owners   = (*kube.Cluster)(nil)
)

// App is the wired application. Close releases the database connections.
type App struct {
	Config   Config
	Store    *pgstore.PG
	Cluster  *kube.Cluster
	Labs     *labs.Live
	Sessions *session.Service
	// Seating admits opens to capacity and keeps the line and the warm
	// pool.
	Seating *seating.Usher
	// API serves the session endpoints; mount more routes in front of it.
	API *httpapi.API
	// Reaper is reapTick and adminReapNow.
	Reaper *reap.Reaper
	// ReapStore is the reaper's store: Store's database on connections of
	// its own (Config.ReapDBConns).
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
func Build(ctx context.Context, cfg Config, now func() time.Time, log *slog.Logger, opts ...Option) (_ *App, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg, err = cfg.resolve(); err != nil {
		return nil, err
	}
	settings := cfg.Settings()
	// opened is what Build has opened so far (database connections, the lab
	// catalog's watcher), released last first when Build fails after all.
	var opened []func()
	defer func() {
		if err != nil {
			for _, release := range slices.Backward(opened) {
				release()
			}
		}
	}()
	auth, err := cfg.Tokens.Authenticator([]byte(cfg.JWTSecret), now)
	if err != nil {
		return nil, settings.Rename(err, &cfg.Tokens)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	catalog, err := labs.OpenLive(cfg.LabsFile, log, newCatalogMetrics(reg))
	if err != nil {
		return nil, cfg.named(&cfg.LabsFile, err)
	}
	rc, err := cfg.restConfig()
	if err != nil {
		return nil, err
	}
	if o.wrapTransport != nil {
		rc.Wrap(o.wrapTransport)
	}
	cluster, err := kube.NewForConfig(cfg.Kube, rc)
	if err != nil {
		return nil, err
	}
	store, err := pgstore.Open(ctx, cfg.DatabaseURL, cfg.Env, pgstore.MaxConns(cfg.DBMaxConns))
	if err != nil {
		return nil, cfg.named(&cfg.DatabaseURL, err)
	}
	opened = append(opened, store.Close)
	reapStore, err := store.WithConns(ctx, cfg.ReapDBConns)
	if err != nil {
		return nil, cfg.named(&cfg.ReapDBConns, err)
	}
	opened = append(opened, reapStore.CloseConns)
	// The warm pool is always kept: the schedule's labs (none without
	// one) and every reservation's class from its lead.
	sched, _ := cfg.PoolSchedule()
	if len(sched.Rules) > 0 {
		if err := sched.Check(func(name string) error {
			switch lab, ok := catalog.Get(name); {
			case !ok:
				return errors.New("unknown lab")
			case lab.Home != nil:
				return errors.New("it keeps a home, and a warm instance is made before its student is known")
			}
			return nil
		}); err != nil {
			return nil, cfg.named(&cfg.WarmPool, err)
		}
	}
	pool := &seating.WarmPool{Schedule: sched, TTL: cfg.WarmPoolTTL, Store: store, Cluster: cluster}
	rows := &session.Starter{
		Store: store, Cluster: cluster, Policy: cfg.Policy, CleanupTimeout: cfg.Limits.CleanupTimeout,
		Now: now, Log: log, Metrics: newSessionMetrics(reg),
	}
	reg.MustRegister(liveCollector{rows})
	usher := seating.NewUsher(seating.Config{
		Rows: rows, Store: store, Cluster: cluster, Labs: catalog, Limits: cfg.Limits,
		Waitlist: store, Pool: pool, Homes: cluster, Reservations: store, ReservationRules: cfg.Reservations,
		Now: now, Log: log, Metrics: newSeatingMetrics(reg),
	})
	reg.MustRegister(seatsCollector{usher})
	svc := &session.Service{Starter: rows, Labs: catalog, Seating: usher, Homes: cluster, OpenRate: cfg.OpenRate}
	desk := reservation.NewDesk(store, catalog, func(l labs.Lab) (labs.Kind, int, int) {
		c := seating.CapacityOf(l, cfg.Limits)
		return c.Kind, c.Need, c.Limit
	}, cfg.Reservations, now)
	api := httpapi.New(httpapi.Options{
		Sessions: svc, Seats: usher, Auth: auth,
		Now: now, Log: log, RetryAfter: cfg.RetryAfter, Reservations: desk,
	})
	var public prometheus.Gatherer = reg
	if cfg.MetricsAddr != "" {
		public = nil // served on its own address only
	}
	reaper := &reap.Reaper{
		Store: reapStore, Cluster: cluster, Now: now, Log: log, Metrics: newReapMetrics(reg),
		Config: cfg.Reap, Backstop: usher,
	}
	a := &App{Config: cfg, Store: store, Cluster: cluster, Labs: catalog, Sessions: svc, Seating: usher, API: api, Kube: rc, Reaper: reaper, Metrics: reg, ReapStore: reapStore}
	// The preview is the same reaper deleting nothing; its run is
	// recorded as a dry run.
	preview := *reaper
	preview.Config.DryRun = true
	a.handler = api.WithAdmin(httpapi.AdminOptions{
		Alerts: store, Limits: cfg.Alerts, Key: cfg.AlertKey(),
	}, api.WithReaper(httpapi.ReaperOptions{
		Reaper: reaper, DryRun: &preview, SchedulerToken: cfg.SchedulerToken, Gatherer: public, MetricsToken: cfg.MetricsToken, HomeKeeper: reaper, Archiver: cluster,
		Status: func(ctx context.Context) (reap.Status, error) {
			return reaper.ReadStatus(ctx, store, cluster, cfg.AdminStatusRuns, cfg.Limits.MaxVMs)
		},
	}))
	// The web terminal and cleanup button (WebSocket: on-prem only).
	term, err := terminal.New(terminal.Options{
		Sessions: svc, Auth: auth, API: api, Kube: rc, Exec: kube.WorkspaceExecutor, Owners: cluster,
		Namespace: cfg.Kube.Namespace, Now: now, Log: log, Limits: cfg.Terminal, WorkspaceKey: cfg.Kube.WorkspaceKey,
	})
	if err != nil {
		return nil, err
	}
	a.handler = term.Mount(a.handler)
	if cfg.LabsReload > 0 {
		watch, stop := context.WithCancel(context.WithoutCancel(ctx))
		ticker := time.NewTicker(cfg.LabsReload)
		a.stop = func() { stop(); ticker.Stop() }
		opened = append(opened, a.stop)
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

// MetricsHandler serves /metrics on LABKEEP_METRICS_ADDR's listener, which
// only the cluster reaches: with a metrics token it requires it, as the
// public handler does; without one it answers every scrape.
func (a *App) MetricsHandler() http.Handler {
	if a.Config.MetricsToken == "" {
		return promhttp.HandlerFor(a.Metrics, promhttp.HandlerOpts{})
	}
	return a.API.Metrics(a.Metrics, a.Config.MetricsToken)
}

// AlertHandler serves POST /guardianAlert alone (any other path is 404):
// what the workspaces' network may reach when the platform's other
// endpoints must stay closed to it — a listener of its own that
// GUARDIAN_WEBHOOK_URL names, or an ingress route. A workspace shares its
// network with guardian, so whatever guardian's alerts reach, its root
// reaches too.
func (a *App) AlertHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(httpapi.GuardianAlertPath, a.handler)
	return mux
}

// Close releases the database connections.
func (a *App) Close() {
	if a.stop != nil {
		a.stop()
	}
	a.ReapStore.CloseConns()
	a.Store.Close()
}

// restConfig loads the cluster credentials.
func (c *Config) restConfig() (*rest.Config, error) {
	if c.Kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, c.named(&c.Kubeconfig, fmt.Errorf("is empty and not running in a cluster: %w", err))
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, c.named(&c.Kubeconfig, err)
	}
	return rc, nil
}
