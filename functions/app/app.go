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

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"labkeep/shared/httpapi"
	"labkeep/shared/kube"
	"labkeep/shared/labs"
	"labkeep/shared/lifetime"
	"labkeep/shared/pgstore"
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
	// GuardianImage is the workspace Pod's sidecar.
	GuardianImage string `split_words:"true" default:"ghcr.io/labkeep/guardian:latest"`
	// SSHAuthorizedKeys (comma-separated) are installed on every node.
	SSHAuthorizedKeys []string `split_words:"true"`
	// RetryAfter is sent with 503 no_capacity.
	RetryAfter time.Duration `split_words:"true" default:"30s"`
	// SchedulerToken authenticates reapTick calls (issue 4); platform shims
	// send it with scheduled events.
	SchedulerToken string `split_words:"true"`
}

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
	if c.MaxConcurrentVms < 0 {
		bad("MAX_CONCURRENT_VMS", "must not be negative, got %d", c.MaxConcurrentVms)
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
	return errors.Join(errs...)
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
	// Kube is the rest config used, for other adapters.
	Kube *rest.Config
}

// Build validates cfg and connects everything. now is the clock (time.Now
// in production). Errors name the setting at fault where there is one.
func Build(ctx context.Context, cfg Config, now func() time.Time, log *slog.Logger) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	catalog, err := labs.LoadFile(cfg.LabsFile)
	if err != nil {
		return nil, fmt.Errorf("%s_LABS_FILE: %w", EnvPrefix, err)
	}
	rc, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cluster, err := kube.NewForConfig(kube.Config{
		Namespace: cfg.Namespace, Env: cfg.Env,
		MaxLifetime: cfg.SessionMaxLifetime, DeadlineGrace: cfg.DeadlineGrace,
		AnchorImage: cfg.AnchorImage, GuardianImage: cfg.GuardianImage,
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
		MaxVMs: cfg.MaxConcurrentVms, Now: now, Log: log,
	}
	api := httpapi.New(httpapi.Options{
		Sessions: svc, Auth: httpapi.NewAuthenticator([]byte(cfg.JWTSecret), now),
		Now: now, Log: log, RetryAfter: cfg.RetryAfter,
	})
	return &App{Config: cfg, Store: store, Cluster: cluster, Labs: catalog, Sessions: svc, API: api, Kube: rc}, nil
}

// Handler is the http.Handler every platform serves.
func (a *App) Handler() http.Handler { return a.API }

// Close releases the database pool.
func (a *App) Close() { a.Store.Close() }

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("%s_KUBECONFIG is empty and not running in a cluster: %w", EnvPrefix, err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%s_KUBECONFIG: %w", EnvPrefix, err)
	}
	rc.QPS, rc.Burst = 50, 100
	return rc, nil
}
