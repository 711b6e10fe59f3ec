// Package session_test runs the session functions end to end on the real
// local stack (kube-apiserver + etcd + kube-controller-manager, virtsim,
// PostgreSQL): HTTP requests in, real objects and rows out. The functions
// always run as the ServiceAccount bound by infra/rbac.yaml, never admin.
package session_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"labkeep/functions/app"
	"labkeep/infra"
	"labkeep/localrun/controlplane"
	"labkeep/localrun/stack"
	"labkeep/localrun/stacktest"
	"labkeep/localrun/virtsim"
	"labkeep/shared/httpapi"
)

var st *stack.Stack

// bootDelay is virtsim's VMI boot time in these tests.
const bootDelay = 500 * time.Millisecond

func TestMain(m *testing.M) {
	stacktest.Main(m, &st, stack.Options{
		VirtSim: virtsim.Options{
			BootDelay: bootDelay,
			// Environments named "neverready-…" get VMs that never boot.
			Faults: func(vm *kubevirtv1.VirtualMachine) virtsim.Fault {
				return virtsim.Fault{NeverReady: strings.HasPrefix(vm.Labels["labkeep.io/env"], "neverready")}
			},
		},
	})
}

const jwtSecret = "test-secret-0123456789abcdef-0123456789"

// schedulerToken is LABKEEP_SCHEDULER_TOKEN, which the functions require.
const schedulerToken = "scheduler-token-for-session-tests"

// env is one deployment of the functions on the shared stack: its own
// namespaces, database and labkeep.io/env.
type env struct {
	t        testing.TB
	name     string
	fnNS     string
	ns       string // sessions namespace
	app      *app.App
	srv      *httptest.Server
	clock    *stacktest.Clock
	db       *pgxpool.Pool
	kube     kubernetes.Interface // admin, for assertions only
	dyn      dynamic.Interface    // admin, for assertions only
	saConfig string               // the functions' kubeconfig
}

type envOptions struct {
	namePrefix string
	maxVMs     int
	quota      bool   // apply infra/resourcequota.yaml
	labsYAML   string // lab templates; "" = infra/labs.yaml
	// capacityWait is LABKEEP_CAPACITY_WAIT (0 = the default).
	capacityWait time.Duration
}

func newEnv(t testing.TB, o envOptions) *env {
	t.Helper()
	ctx := context.Background()
	prefix := o.namePrefix
	if prefix == "" {
		prefix = "test"
	}
	e := &env{t: t, name: prefix + "-" + stacktest.Suffix(), clock: &stacktest.Clock{}}
	e.fnNS, e.ns = e.name+"-fn", e.name+"-sessions"
	var err error
	if e.kube, err = kubernetes.NewForConfig(st.Admin()); err != nil {
		t.Fatal(err)
	}
	if e.dyn, err = dynamic.NewForConfig(st.Admin()); err != nil {
		t.Fatal(err)
	}
	files := []string{"namespaces.yaml", "rbac.yaml"}
	if o.quota {
		files = append(files, "resourcequota.yaml")
	}
	if err := infra.Apply(ctx, st.Admin(), infra.Placement{Functions: e.fnNS, Sessions: e.ns}, files...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, ns := range []string{e.fnNS, e.ns} {
			_ = e.kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		}
	})
	sa, err := st.CP.ServiceAccountConfig(ctx, e.fnNS, infra.ServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	e.saConfig = filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(e.saConfig, sa, "system:serviceaccount:"+e.fnNS+":"+infra.ServiceAccount); err != nil {
		t.Fatal(err)
	}
	labsFile := filepath.Join(dir, "labs.yaml")
	labsYAML := []byte(o.labsYAML)
	if o.labsYAML == "" {
		if labsYAML, err = infra.File("labs.yaml"); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(labsFile, labsYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	dsn := stacktest.CreateDatabase(e.t, st, e.name, 10)
	maxVMs := o.maxVMs
	if maxVMs == 0 {
		maxVMs = 8
	}
	cfg := app.Config{
		Env: e.name, DatabaseURL: dsn, Namespace: e.ns,
		SessionLifetime: 60 * time.Minute, SessionMaxLifetime: 180 * time.Minute, DeadlineGrace: 15 * time.Minute,
		MaxConcurrentVms: maxVMs, LabsFile: labsFile, JWTSecret: jwtSecret, Kubeconfig: e.saConfig,
		KubeTimeout: 10 * time.Second, AnchorImage: "registry.k8s.io/pause:3.10", GuardianImage: "labkeep/guardian:test",
		RetryAfter: 20 * time.Second, SchedulerToken: schedulerToken, CapacityWait: o.capacityWait,
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.app, err = app.Build(ctx, cfg, e.clock.Now, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.app.Close)
	e.srv = httptest.NewServer(e.app.Handler())
	t.Cleanup(e.srv.Close)
	if e.db, err = pgxpool.New(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.db.Close)
	return e
}

func (e *env) token(student, role string) string {
	e.t.Helper()
	tok, err := httpapi.Sign([]byte(jwtSecret), student, role, time.Now().Add(365*24*time.Hour))
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// sessionView is the session JSON as a portal reads it.
type sessionView struct {
	ID               string     `json:"id"`
	Student          string     `json:"student"`
	Lab              string     `json:"lab"`
	Kind             string     `json:"kind"`
	Status           string     `json:"status"`
	StartedAt        time.Time  `json:"startedAt"`
	ExpiresAt        time.Time  `json:"expiresAt"`
	MaxExpiresAt     time.Time  `json:"maxExpiresAt"`
	ReadyAt          *time.Time `json:"readyAt"`
	RemainingSeconds int64      `json:"remainingSeconds"`
	Extendable       bool       `json:"extendable"`
	ServerTime       time.Time  `json:"serverTime"`
	Nodes            []struct {
		Name  string `json:"name"`
		Role  string `json:"role"`
		Ready bool   `json:"ready"`
		SSH   struct {
			Host string `json:"host"`
			Port int    `json:"port"`
		} `json:"ssh"`
	} `json:"nodes"`
	FailureReason string `json:"failureReason"`
}

type response struct {
	// received is when the response arrived (wall clock).
	received time.Time
	status   int
	header   http.Header
	body     []byte
	session  sessionView // success body, or the session in an error body
	code     string      // error code
	message  string
}

// do sends one request; body "" sends none. ctype "" means application/json.
func (e *env) do(method, path, token, body, ctype string) response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		if ctype == "" {
			ctype = "application/json"
		}
		req.Header.Set("Content-Type", ctype)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	r := response{status: res.StatusCode, header: res.Header, received: time.Now()}
	r.body, _ = io.ReadAll(res.Body)
	if res.StatusCode < 300 {
		if err := json.Unmarshal(r.body, &r.session); err != nil {
			e.t.Fatalf("%s %s: %d with undecodable body %q", method, path, res.StatusCode, r.body)
		}
		return r
	}
	var eb struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
		Session *sessionView `json:"session"`
	}
	if err := json.Unmarshal(r.body, &eb); err != nil || eb.Error.Code == "" {
		e.t.Fatalf("%s %s: %d without a JSON error body: %q", method, path, res.StatusCode, r.body)
	}
	r.code, r.message = eb.Error.Code, eb.Error.Message
	if eb.Session != nil {
		r.session = *eb.Session
	}
	return r
}

func (e *env) open(student, lab string) response {
	e.t.Helper()
	return e.do("POST", "/openSession", e.token(student, "student"), fmt.Sprintf(`{"lab":%q}`, lab), "")
}

// waitRunning polls getSession until the session is running.
func (e *env) waitRunning(student string, timeout time.Duration) sessionView {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := e.do("GET", "/getSession", e.token(student, "student"), "", "")
		if r.status == 200 && r.session.Status == "running" {
			return r.session
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("session of %s not running after %s: %d %s", student, timeout, r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	gvrVM  = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	gvrVMI = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
	gvrDV  = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}
	gvrs   = map[string]schema.GroupVersionResource{
		"VirtualMachine":         gvrVM,
		"VirtualMachineInstance": gvrVMI,
		"DataVolume":             gvrDV,
		"Job":                    {Group: "batch", Version: "v1", Resource: "jobs"},
		"Secret":                 {Version: "v1", Resource: "secrets"},
		"Service":                {Version: "v1", Resource: "services"},
		"NetworkPolicy":          {Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"},
		"Pod":                    {Version: "v1", Resource: "pods"},
	}
)

// objects lists every object of the kinds labkeep creates (or causes) in
// the sessions namespace as "Kind/name", sorted; selector filters by label
// ("" = all).
func (e *env) objects(selector string) []string {
	e.t.Helper()
	var out []string
	for kind, gvr := range gvrs {
		list, err := e.dyn.Resource(gvr).Namespace(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			e.t.Fatalf("list %s: %v", kind, err)
		}
		for _, o := range list.Items {
			out = append(out, kind+"/"+o.GetName())
		}
	}
	sort.Strings(out)
	return out
}

// waitNoObjects waits until the sessions namespace holds nothing labkeep
// made (VMIs, DataVolumes and the anchor's Pod included).
func (e *env) waitNoObjects(timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := e.objects("")
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("objects left after %s: %v", timeout, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rows returns every session row as "id status" plus its expiry, sorted,
// for before/after comparisons.
func (e *env) rows() []string {
	e.t.Helper()
	rows, err := e.db.Query(context.Background(), `SELECT id::text || ' ' || student || ' ' || status || ' ' || expires_at::text FROM sessions ORDER BY 1`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func jsonBody(v any) string {
	b, _ := json.Marshal(v)
	return string(bytes.TrimSpace(b))
}

// internals are fragments of what the API server says when it refuses
// (ServiceAccount, quota and object names, admission policy messages);
// none may reach a student.
var internals = []string{"serviceaccount", "validatingadmissionpolicy", "quota", "injected fault", "denied", "forbidden", "lk-", "labkeep-vms"}

// noInternals fails if a response to a student carries cluster internals.
func noInternals(t testing.TB, what string, r response) {
	t.Helper()
	body := strings.ToLower(string(r.body))
	for _, s := range internals {
		if strings.Contains(body, s) {
			t.Errorf("%s: response to a student leaks %q: %s", what, s, r.body)
		}
	}
}
