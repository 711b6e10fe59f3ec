// Package devserve puts the session functions on the local stack for
// `make run`: it installs the production RBAC, quota, admission policy and
// sample lab templates from infra/, runs the functions as the infra ServiceAccount
// (never admin), serves them on LABKEEP_HTTP_ADDR and prints ready-made
// tokens. Every LABKEEP_* setting applies as in production; the ones
// production must be given (environment, database, JWT secret, labs file,
// kubeconfig) default to the local stack's. Development only.
package devserve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"labkeep/functions/app"
	"labkeep/infra"
	"labkeep/localrun/controlplane"
	"labkeep/localrun/images"
	"labkeep/localrun/node"
	"labkeep/localrun/stack"
	"labkeep/shared/access"
	"labkeep/shared/httpapi"
)

// Server is the running functions.
type Server struct {
	App *app.App
	// URL is the base URL the functions answer on.
	URL string
	// StudentToken, InstructorToken and AdminToken are issued as the
	// portal would under the configured token rules (LABKEEP_JWT_*):
	// valid for LABKEEP_JWT_MAX_LIFETIME, with the audience and issuer
	// required. The student is a member of SampleCourse and the
	// instructor teaches it.
	StudentToken, InstructorToken, AdminToken string
	// EnvFile is the shell file that exports them (TOKEN,
	// INSTRUCTOR_TOKEN, ADMIN_TOKEN, METRICS_TOKEN for /metrics, and LABKEEP_URL and LABKEEP_ADMIN_TOKEN
	// for the labkeep CLI): the printed example calls work once it is
	// sourced.
	EnvFile        string
	srv            *http.Server
	alerts         *http.Server // nil unless Start opened guardian's alert listener
	done           chan error
	schedulerToken string
	log            *slog.Logger
}

// SampleStudent is the sub of the printed student token, and
// SampleCourse the course its courses claim lists and the printed
// instructor token teaches.
const (
	SampleStudent = "student-1"
	SampleCourse  = "cs-101"
)

// LocalAudience and LocalIssuer are the aud and iss make run's functions
// require (LABKEEP_JWT_AUDIENCE and LABKEEP_JWT_ISSUER win) and its
// printed tokens carry.
const (
	LocalAudience = "labkeep"
	LocalIssuer   = "labkeep-run"
)

// Start reads the settings (local defaults for the required ones), installs
// infra/ into st, builds the functions as the infra ServiceAccount and
// serves them; it prints the URL, tokens and example calls to out. Files
// (labs.yaml, the functions' kubeconfig, the JWT secret, the workspace
// key) go to stateDir.
// The labs are infra/base/labs.yaml's, unless LABKEEP_LABS_FILE names
// others; on a stack with real KubeVirt its VM labs are made local
// (stack.LocalVMLabs: the local guest disk, sizes the node holds).
func Start(ctx context.Context, st *stack.Stack, stateDir string, log *slog.Logger, out io.Writer) (s *Server, err error) {
	labsFile := filepath.Join(stateDir, "labs.yaml")
	saKubeconfig := filepath.Join(stateDir, "functions.kubeconfig")
	// The settings production must be given default to the local stack's;
	// any LABKEEP_* variable that is set still wins.
	cfg := app.DefaultConfig()
	cfg.Env, cfg.DatabaseURL = "local", st.DSN()
	for file, setting := range map[string]*string{
		"jwt-secret": &cfg.JWTSecret, "scheduler-token": &cfg.SchedulerToken,
		"workspace-key": &cfg.WorkspaceSecret, "metrics-token": &cfg.MetricsToken,
	} {
		if *setting, err = localSecret(filepath.Join(stateDir, file)); err != nil {
			return nil, err
		}
	}
	cfg.LabsFile, cfg.Kubeconfig = labsFile, saKubeconfig
	// Every shipped deploy template requires aud and iss; so does make
	// run, and the tokens it prints carry them.
	cfg.Tokens.Audience, cfg.Tokens.Issuer = LocalAudience, LocalIssuer
	if st.Node != nil {
		// Workspace Pods run on the local node: ask only for the
		// capabilities its runc can grant.
		cfg.WorkspacePodFile = filepath.Join(stateDir, "workspace-pod.yaml")
		dropped, err := node.WriteWorkspacePod(cfg.WorkspacePodFile)
		if err != nil {
			return nil, err
		}
		if len(dropped) > 0 {
			log.Warn("workspace Pods on this machine lack capabilities its root cannot grant", "dropped", dropped)
		}
		cfg.Kube.SSHSourceCIDRs = append(cfg.Kube.SSHSourceCIDRs, st.Node.HostSource())
		cfg.Kube.PlatformSourceCIDRs = append(cfg.Kube.PlatformSourceCIDRs, st.Node.HostSource())
	}
	if err := cfg.Settings().Read(os.LookupEnv); err != nil {
		return nil, err
	}
	var alertLn net.Listener
	defer func() {
		if s == nil && alertLn != nil {
			alertLn.Close()
		}
	}()
	if cfg.Kube.GuardianWebhookURL == "" && st.Node != nil {
		// guardian's alerts reach the host at its address on the node's
		// link, on a listener that serves nothing else: a workspace
		// reaches whatever its guardian reaches, and the functions' other
		// endpoints stay closed to it.
		if alertLn, err = net.Listen("tcp", net.JoinHostPort(st.Node.HostIP, "0")); err != nil {
			return nil, fmt.Errorf("guardian's alert listener: %w", err)
		}
		cfg.Kube.GuardianWebhookURL = "http://" + alertLn.Addr().String() + httpapi.GuardianAlertPath
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.LabsFile == labsFile {
		sample, err := infra.File("labs.yaml")
		if err != nil {
			return nil, err
		}
		if st.KubeVirt {
			if sample, err = stack.LocalVMLabs(sample); err != nil {
				return nil, err
			}
		}
		if err := os.WriteFile(labsFile, sample, 0o644); err != nil {
			return nil, err
		}
	}
	place := infra.Placement{Functions: infra.FunctionsNamespace, Sessions: cfg.Kube.Namespace}
	if err := infra.Apply(ctx, st.Admin(), place, "namespaces.yaml", "rbac.yaml", "resourcequota.yaml"); err != nil {
		return nil, fmt.Errorf("installing infra/: %w", err)
	}
	// The admission policy production applies, so what the functions may
	// not create in production is refused here too.
	adm, err := Admission(cfg.Env, st.KubeVirt, cfg.Kube.GuardianWebhookURL)
	if err != nil {
		return nil, err
	}
	if err := infra.ApplyAdmission(ctx, st.Admin(), place, adm); err != nil {
		return nil, fmt.Errorf("installing infra/'s admission policy: %w", err)
	}
	if err := matchQuota(ctx, st, cfg); err != nil {
		return nil, err
	}
	if cfg.Kubeconfig == saKubeconfig {
		sa, err := st.CP.ServiceAccountConfig(ctx, infra.FunctionsNamespace, infra.ServiceAccount)
		if err != nil {
			return nil, err
		}
		if err := controlplane.WriteKubeconfig(saKubeconfig, sa, "system:serviceaccount:"+infra.FunctionsNamespace+":"+infra.ServiceAccount); err != nil {
			return nil, err
		}
	}
	a, err := app.Build(ctx, cfg, time.Now, log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("LABKEEP_HTTP_ADDR: %w", err)
	}
	s = &Server{App: a, URL: "http://" + ln.Addr().String(), done: make(chan error, 1), schedulerToken: cfg.SchedulerToken, log: log}
	rules, now := cfg.Tokens, time.Now()
	if s.StudentToken, err = rules.Issue([]byte(cfg.JWTSecret), SampleStudent, access.RoleStudent, now, SampleCourse); err == nil {
		if s.InstructorToken, err = rules.Issue([]byte(cfg.JWTSecret), "instructor-1", access.RoleInstructor, now, SampleCourse); err == nil {
			s.AdminToken, err = rules.Issue([]byte(cfg.JWTSecret), "admin-1", access.RoleAdmin, now)
		}
	}
	if err != nil {
		ln.Close()
		a.Close()
		return nil, err
	}
	s.EnvFile = filepath.Join(stateDir, EnvFileName)
	if err := writeEnvFile(s.EnvFile, s); err != nil {
		ln.Close()
		a.Close()
		return nil, err
	}
	s.srv = &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { s.done <- s.srv.Serve(ln) }()
	if alertLn != nil {
		s.alerts = &http.Server{Handler: a.AlertHandler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = s.alerts.Serve(alertLn) }()
		fmt.Fprintf(out, "guardian's alerts (POST %s only) at http://%s\n", httpapi.GuardianAlertPath, alertLn.Addr())
	}
	fmt.Fprintf(out, "session functions (env %q, namespace %q, max %d VMs, lifetime %s, max %s) at %s\n",
		cfg.Env, cfg.Kube.Namespace, cfg.Limits.MaxVMs, cfg.Policy.Lifetime, cfg.Policy.MaxLifetime, s.URL)
	fmt.Fprintf(out, "  labs:          %v (from %s)\n", a.Labs.Names(), cfg.LabsFile)
	fmt.Fprintf(out, "  student token: %s\n", s.StudentToken)
	fmt.Fprintf(out, "  instructor token (books %s's classes): %s\n", SampleCourse, s.InstructorToken)
	fmt.Fprintf(out, "  admin token:   %s\n", s.AdminToken)
	fmt.Fprintf(out, "  first:         source %s   # sets $TOKEN, $INSTRUCTOR_TOKEN, $ADMIN_TOKEN, $LABKEEP_URL, $LABKEEP_ADMIN_TOKEN, $METRICS_TOKEN\n", s.EnvFile)
	fmt.Fprintf(out, "  try:           curl -sS -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/json' -d '{\"lab\":\"linux-vm\"}' %s/openSession\n", s.URL)
	fmt.Fprintf(out, "                 curl -sS -H \"Authorization: Bearer $TOKEN\" %s/getSession\n", s.URL)
	fmt.Fprintf(out, "  reaper:        curl -sS -X POST -H \"Authorization: Bearer $ADMIN_TOKEN\" -H 'Content-Type: application/json' -d '{\"dryRun\":true}' %s/adminReapNow   # deletes nothing\n", s.URL)
	fmt.Fprintf(out, "                 curl -sS -X POST -H \"Authorization: Bearer $ADMIN_TOKEN\" %s/adminReapNow\n", s.URL)
	fmt.Fprintf(out, "                 curl -sS -H \"Authorization: Bearer $ADMIN_TOKEN\" %s/adminStatus ; curl -sS -H \"Authorization: Bearer $METRICS_TOKEN\" %s/metrics\n", s.URL, s.URL)
	return s, nil
}

// Admission is the admission policy's parameters for the local stack's
// functions of environment env: admission-policy.yaml's own, with the
// local guest disk's repository allowed where real KubeVirt boots the VM
// labs from it (stack.LocalVMLabs), as an operator lists each lab image,
// guardian's webhook rule pinned to webhook (the functions'
// LABKEEP_GUARDIAN_WEBHOOK_URL: the host's alert listener), as an
// operator pins theirs, and students' homes of the node's default
// StorageClass, as an operator lists theirs.
func Admission(env string, kubevirt bool, webhook string) (infra.Admission, error) {
	a := infra.Admission{Env: env}
	pin, err := infra.WebhookPin(webhook)
	if err != nil {
		return a, err
	}
	a.Data = map[string]string{"guardianWebhooks": pin, "homeStorageClasses": node.StorageClassName}
	if kubevirt {
		repo, _, _ := strings.Cut(images.GuestDebian, "@")
		if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
			repo = repo[:i]
		}
		a.Images = []string{repo}
	}
	return a, nil
}

// EnvFileName is the name, in the state directory, of Server.EnvFile.
const EnvFileName = "functions.env"

// writeEnvFile writes s's URL and tokens as shell exports, readable by the
// owner only (they are credentials).
func writeEnvFile(path string, s *Server) error {
	var b strings.Builder
	for _, kv := range [][2]string{
		{"TOKEN", s.StudentToken}, {"INSTRUCTOR_TOKEN", s.InstructorToken}, {"ADMIN_TOKEN", s.AdminToken},
		{"LABKEEP_URL", s.URL}, {"LABKEEP_ADMIN_TOKEN", s.AdminToken}, {"METRICS_TOKEN", s.App.Config.MetricsToken},
	} {
		fmt.Fprintf(&b, "export %s=%q\n", kv[0], kv[1])
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// RunScheduler plays the production scheduler (PingSource, CronJob,
// EventBridge) until ctx is done: every interval it POSTs /reapTick with
// the scheduler token, as they do, and logs the outcome.
func (s *Server) RunScheduler(ctx context.Context, interval time.Duration) {
	Schedule(ctx, s.URL, s.schedulerToken, interval, func(status int, report []byte, err error) {
		if err != nil {
			s.log.Error("reapTick", "err", err)
			return
		}
		s.log.Info("reapTick", "status", status, "report", string(report))
	})
}

// Schedule is the production scheduler for functions served at url: every
// interval, from the first interval on, it POSTs /reapTick with the
// scheduler token and hands each outcome to done (the answer's status and
// body, or the error that left it without one), until ctx is done. A tick
// cut short by ctx's end is not handed over.
func Schedule(ctx context.Context, url, token string, interval time.Duration, done func(status int, body []byte, err error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		status, body, err := tick(ctx, url, token)
		if ctx.Err() != nil {
			return
		}
		done(status, body, err)
	}
}

// tick is one scheduled POST /reapTick.
func tick(ctx context.Context, url, token string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/reapTick", nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return res.StatusCode, body, err
}

// Stop shuts the server down and closes the database connections.
func (s *Server) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if s.alerts != nil {
		err = errors.Join(err, s.alerts.Shutdown(ctx))
	}
	if serveErr := <-s.done; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	s.App.Close()
	return err
}

// matchQuota keeps the namespace's VM quota equal to the configured limit,
// as an operator would when changing LABKEEP_MAX_CONCURRENT_VMS.
func matchQuota(ctx context.Context, st *stack.Stack, cfg app.Config) error {
	cs, err := kubernetes.NewForConfig(st.Admin())
	if err != nil {
		return err
	}
	want := resource.MustParse(strconv.Itoa(cfg.Limits.MaxVMs))
	key := corev1.ResourceName("count/virtualmachines.kubevirt.io")
	// The quota controller writes status concurrently; retry on conflict.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		q, err := cs.CoreV1().ResourceQuotas(cfg.Kube.Namespace).Get(ctx, infra.VMQuota, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur := q.Spec.Hard[key]; cur.Cmp(want) == 0 {
			return nil
		}
		q.Spec.Hard[key] = want
		_, err = cs.CoreV1().ResourceQuotas(cfg.Kube.Namespace).Update(ctx, q, metav1.UpdateOptions{})
		return err
	})
}

// localSecret returns the secret kept in path (the JWT secret, the
// workspace key, the scheduler token), creating a random one the first
// time, so tokens and workspaces' credentials stay valid across restarts
// of `make run`.
func localSecret(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil && len(b) >= 32 {
		return string(b), nil
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	s := hex.EncodeToString(b)
	return s, os.WriteFile(path, []byte(s), 0o600)
}
