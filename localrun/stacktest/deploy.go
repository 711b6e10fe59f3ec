package stacktest

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"labkeep/functions/app"
	"labkeep/infra"
	"labkeep/localrun/controlplane"
	"labkeep/localrun/images"
	"labkeep/localrun/node"
	"labkeep/localrun/stack"
	"labkeep/shared/httpapi"
)

// JWTSecret signs the tokens of every Deployment (LABKEEP_JWT_SECRET).
const JWTSecret = "stacktest-secret-0123456789abcdef-0123456789"

// WorkspaceKey is every Deployment's LABKEEP_WORKSPACE_KEY: workspaces'
// own credentials (guardian's alert webhook's and cleanup token) are
// derived from it.
const WorkspaceKey = "stacktest-workspace-key-0123456789abcdef-0123"

// SchedulerToken is every Deployment's LABKEEP_SCHEDULER_TOKEN.
const SchedulerToken = "stacktest-scheduler-token-0123456789"

// MetricsToken is every Deployment's LABKEEP_METRICS_TOKEN: /metrics on
// the public handler answers only it (Client.Scrape sends it).
const MetricsToken = "stacktest-metrics-token-0123456789"

// Images the deployments run: the ones the local node provides, under the
// names production pulls.
const (
	AnchorImage   = images.Pause
	GuardianImage = images.Guardian
)

// Options are what tests vary between deployments. A zero field keeps
// app.DefaultConfig's value, except where said otherwise.
type Options struct {
	// Env is the exact labkeep.io/env. Empty: EnvPrefix, a dash and a
	// random suffix, so deployments sharing the stack never meet.
	Env string
	// EnvPrefix starts a generated Env ("test" if empty). The suite's
	// virtsim may choose faults by it (e.g. VMs of "neverready-…" never
	// boot).
	EnvPrefix string
	// Namespace is a sessions namespace to share with another deployment
	// (created if missing, never deleted here): the shipped manifests are
	// applied to it and this deployment's ServiceAccount gets its own
	// RoleBinding to the shipped Role, as an operator adds for a second
	// environment. Empty: a namespace of its own, deleted when the test ends.
	Namespace string
	// DatabaseURL is another deployment's database to share (its
	// App.Config.DatabaseURL), as a misconfigured environment would. Empty:
	// a database of its own.
	DatabaseURL string
	// Quota applies infra/base/resourcequota.yaml to the sessions namespace.
	Quota bool
	// LabsYAML is the lab catalog; empty means infra/base/labs.yaml.
	LabsYAML string
	// MaxVMs is LABKEEP_MAX_CONCURRENT_VMS.
	MaxVMs int
	// MaxPods is LABKEEP_MAX_CONCURRENT_PODS.
	MaxPods int
	// Lifetime and MaxLifetime are LABKEEP_SESSION_LIFETIME and
	// LABKEEP_SESSION_MAX_LIFETIME; with only Lifetime set, MaxLifetime is
	// three times it (the default ratio).
	Lifetime, MaxLifetime time.Duration
	// DeadlineGrace is LABKEEP_DEADLINE_GRACE.
	DeadlineGrace time.Duration
	// CapacityWait is LABKEEP_CAPACITY_WAIT.
	CapacityWait time.Duration
	// DryRun is LABKEEP_REAP_DRY_RUN.
	DryRun bool
	// RunDeadline is LABKEEP_REAP_RUN_DEADLINE.
	RunDeadline time.Duration
	// KubeQPS and KubeBurst are LABKEEP_KUBE_QPS and LABKEEP_KUBE_BURST.
	KubeQPS   float32
	KubeBurst int
	// GuardianWebhookURL is LABKEEP_GUARDIAN_WEBHOOK_URL (workspace Pods
	// must reach it: the host's address on the node's link,
	// node.Node.HostIP, not loopback). Empty on a stack with a node: the
	// deployment serves guardian's alerts alone on a listener of its own
	// there, as make run does (app.App.AlertHandler).
	GuardianWebhookURL string
	// WarmPool, WarmPoolTTL and WarmPoolLead are LABKEEP_WARM_POOL,
	// LABKEEP_WARM_POOL_TTL and LABKEEP_WARM_POOL_LEAD (the schedule in
	// UTC).
	WarmPool                  string
	WarmPoolTTL, WarmPoolLead time.Duration
	// PlatformSSHKeys are LABKEEP_PLATFORM_SSH_KEYS: authorized_keys lines
	// every session's nodes accept besides the student's.
	PlatformSSHKeys []string
	// DBConns is how many database connections the functions keep (the
	// DSN's pool_max_conns; 10 if zero).
	DBConns int
	// Log is the functions' logger (Logger() if nil).
	Log *slog.Logger
	// TerminalIdle is LABKEEP_TERMINAL_IDLE.
	TerminalIdle time.Duration
	// HomeTotal is LABKEEP_HOME_TOTAL (a quantity; empty: the default).
	HomeTotal string
	// HomeReaderImage is LABKEEP_HOME_READER_IMAGE (empty: the default,
	// the workspace image the node has).
	HomeReaderImage string
	// WorkspacePodFile is LABKEEP_WORKSPACE_POD_FILE, for Pods placed on a
	// node the test joined itself (the cgroup v2 guest node, by its
	// selector and toleration). Empty: on a stack with a node of its own,
	// the Pod its runc can grant (node.WriteWorkspacePod); else the
	// built-in one.
	WorkspacePodFile string
}

// Deployment is one environment's session functions and reaper on the
// shared stack, wired by app.Build exactly as production (metrics
// included): its own functions namespace and database, running as the
// infra ServiceAccount through a kubeconfig file, served over HTTP.
// Everything it creates goes when the test ends.
type Deployment struct {
	Client // the HTTP client for Server, with the deployment's clock

	// Env is its labkeep.io/env; Namespace the sessions namespace;
	// FunctionsNamespace where its ServiceAccount lives.
	Env, Namespace, FunctionsNamespace string
	// Kubeconfig is the file the functions read their credentials from.
	Kubeconfig string
	// App is the wired application: Sessions, Reaper, Store, Cluster.
	App    *app.App
	Server *httptest.Server
	// Clock is the functions' and the reaper's clock.
	Clock *Clock
	// Faults sits in the functions' transport to the API server.
	Faults *Faults
	// DB is a pool of its own on the deployment's database, for
	// assertions (it never competes with the functions' pool).
	DB *pgxpool.Pool
	// Kube and Dyn are admin clients, for assertions and set-up only.
	Kube kubernetes.Interface
	Dyn  dynamic.Interface
}

// Deploy sets up a Deployment on st with o.
func Deploy(t testing.TB, st *stack.Stack, o Options) *Deployment {
	t.Helper()
	ctx := context.Background()
	d := &Deployment{Env: o.Env, Namespace: o.Namespace, Clock: &Clock{}, Faults: &Faults{}}
	base := d.Env
	if d.Env == "" {
		prefix := o.EnvPrefix
		if prefix == "" {
			prefix = "test"
		}
		d.Env = prefix + "-" + Suffix()
		base = d.Env
	} else {
		base = d.Env + "-" + Suffix()
	}
	d.FunctionsNamespace = base + "-fn"
	if d.Namespace == "" {
		d.Namespace = base + "-sessions"
	}
	d.Kube, d.Dyn = AdminClients(t, st)

	files := []string{"namespaces.yaml", "rbac.yaml"}
	if o.Quota {
		files = append(files, "resourcequota.yaml")
	}
	if err := infra.Apply(ctx, st.Admin(), infra.Placement{Functions: d.FunctionsNamespace, Sessions: d.Namespace}, files...); err != nil {
		t.Fatal(err)
	}
	own := []string{d.FunctionsNamespace}
	if o.Namespace == "" {
		own = append(own, d.Namespace)
	} else if err := d.bindRole(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, ns := range own {
			_ = d.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		}
	})

	dir := t.TempDir()
	sa, err := st.CP.ServiceAccountConfig(ctx, d.FunctionsNamespace, infra.ServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	d.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(d.Kubeconfig, sa, "system:serviceaccount:"+d.FunctionsNamespace+":"+infra.ServiceAccount); err != nil {
		t.Fatal(err)
	}
	labsYAML := []byte(o.LabsYAML)
	if o.LabsYAML == "" {
		if labsYAML, err = infra.File("labs.yaml"); err != nil {
			t.Fatal(err)
		}
	}
	labsFile := filepath.Join(dir, "labs.yaml")
	if err := os.WriteFile(labsFile, labsYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	conns := o.DBConns
	if conns == 0 {
		conns = 10
	}
	dsn := o.DatabaseURL
	if dsn == "" {
		dsn = CreateDatabase(t, st, d.Env, conns)
	}

	cfg := o.config(app.DefaultConfig())
	cfg.Env, cfg.DatabaseURL, cfg.Kube.Namespace, cfg.LabsFile, cfg.Kubeconfig = d.Env, dsn, d.Namespace, labsFile, d.Kubeconfig
	cfg.JWTSecret, cfg.SchedulerToken, cfg.WorkspaceSecret, cfg.MetricsToken = JWTSecret, SchedulerToken, WorkspaceKey, MetricsToken
	if o.WorkspacePodFile != "" {
		cfg.WorkspacePodFile = o.WorkspacePodFile
	} else if st.Node != nil {
		// Workspace Pods run on the local node: ask only for what its
		// runc can grant.
		cfg.WorkspacePodFile = filepath.Join(dir, "workspace-pod.yaml")
		dropped, err := node.WriteWorkspacePod(cfg.WorkspacePodFile)
		if err != nil {
			t.Fatal(err)
		}
		if len(dropped) > 0 {
			t.Logf("workspace Pods here lack %v: this host's root cannot grant them", dropped)
		}
		cfg.Kube.SSHSourceCIDRs = append(cfg.Kube.SSHSourceCIDRs, st.Node.HostSource())
		cfg.Kube.PlatformSourceCIDRs = append(cfg.Kube.PlatformSourceCIDRs, st.Node.HostSource())
	}
	var alertLn net.Listener
	if st.Node != nil && cfg.Kube.GuardianWebhookURL == "" {
		if alertLn, err = net.Listen("tcp", net.JoinHostPort(st.Node.HostIP, "0")); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { alertLn.Close() })
		cfg.Kube.GuardianWebhookURL = "http://" + alertLn.Addr().String() + httpapi.GuardianAlertPath
	}
	log := o.Log
	if log == nil {
		log = Logger()
	}
	if d.App, err = app.Build(ctx, cfg, d.Clock.Now, log, app.WrapTransport(d.Faults.wrap)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.App.Close)
	d.Server = httptest.NewServer(d.App.Handler())
	t.Cleanup(d.Server.Close)
	if alertLn != nil {
		alerts := &http.Server{Handler: d.App.AlertHandler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = alerts.Serve(alertLn) }()
		t.Cleanup(func() { _ = alerts.Close() })
	}
	if d.DB, err = pgxpool.New(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.DB.Close)
	d.Client = Client{t: t, URL: d.Server.URL, Now: d.Clock.Now}
	return d
}

// config sets the settings o names on cfg.
func (o Options) config(cfg app.Config) app.Config {
	cfg.Kube.AnchorImage, cfg.Kube.GuardianImage = AnchorImage, GuardianImage
	set := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	set(&cfg.Policy.Lifetime, o.Lifetime)
	set(&cfg.Policy.MaxLifetime, o.MaxLifetime)
	if o.Lifetime != 0 && o.MaxLifetime == 0 {
		cfg.Policy.MaxLifetime = 3 * o.Lifetime
	}
	set(&cfg.Kube.DeadlineGrace, o.DeadlineGrace)
	set(&cfg.Limits.CapacityWait, o.CapacityWait)
	set(&cfg.Reap.RunDeadline, o.RunDeadline)
	if o.MaxVMs != 0 {
		cfg.Limits.MaxVMs = o.MaxVMs
	}
	if o.MaxPods != 0 {
		cfg.Limits.MaxPods = o.MaxPods
	}
	if o.HomeTotal != "" {
		cfg.Kube.HomeTotal = resource.MustParse(o.HomeTotal)
	}
	if o.HomeReaderImage != "" {
		cfg.Kube.HomeReaderImage = o.HomeReaderImage
	}
	if o.KubeQPS != 0 {
		cfg.Kube.QPS = o.KubeQPS
	}
	if o.KubeBurst != 0 {
		cfg.Kube.Burst = o.KubeBurst
	}
	cfg.Reap.DryRun = o.DryRun
	cfg.WarmPool = o.WarmPool
	set(&cfg.WarmPoolTTL, o.WarmPoolTTL)
	set(&cfg.WarmPoolLead, o.WarmPoolLead)
	set(&cfg.Terminal.Idle, o.TerminalIdle)
	cfg.Kube.GuardianWebhookURL = o.GuardianWebhookURL
	if o.PlatformSSHKeys != nil {
		cfg.Kube.PlatformSSHKeys = o.PlatformSSHKeys
	}
	return cfg
}

// bindRole binds the shipped functions Role in the shared sessions
// namespace to this deployment's ServiceAccount: the shipped RoleBinding
// names one functions namespace, the last one applied.
func (d *Deployment) bindRole(ctx context.Context) error {
	_, err := d.Kube.RbacV1().RoleBindings(d.Namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: infra.ServiceAccount + "-" + d.FunctionsNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: infra.ServiceAccount},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: infra.ServiceAccount, Namespace: d.FunctionsNamespace}},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// AdminClients are typed and dynamic clients with st's admin credentials,
// for set-up and assertions (never for the code under test).
func AdminClients(t testing.TB, st *stack.Stack) (kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(st.Admin())
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(st.Admin())
	if err != nil {
		t.Fatal(err)
	}
	return cs, dyn
}
