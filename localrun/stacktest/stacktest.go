// Package stacktest is the one harness the integration suites (test/…)
// share: one local stack per test binary (Main, from TestMain; stopped on
// exit or Ctrl-C); Deploy, which puts one environment's functions and
// reaper on it wired by app.Build exactly as production (own namespaces and
// database, the infra ServiceAccount, a settable Clock so expiry is tested
// without sleeping, transport Faults); a Client for its HTTP API; one
// object listing (ListObjects); Eventually and Until, the one way to wait
// for the cluster or the database; and server-side refusals (Refuse).
package stacktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"labkeep/localrun/stack"
)

// Main starts a stack with opts for the test binary, stores it in *st, runs
// the tests and exits with their code. The stack uses DATABASE_URL's
// PostgreSQL when that is set (a CI setup that brings its own), and stops
// on SIGINT/SIGTERM too, so an interrupted run leaves nothing behind.
func Main(m *testing.M, st **stack.Stack, opts stack.Options) {
	opts.StopOnSignal = true
	if opts.DatabaseURL == "" {
		opts.DatabaseURL = os.Getenv("DATABASE_URL")
	}
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	if opts.VirtSim.Logger == nil {
		opts.VirtSim.Logger = Logger()
	}
	s, err := stack.Start(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stack:", err)
		os.Exit(1)
	}
	*st = s
	code := m.Run()
	s.Stop()
	os.Exit(code)
}

// BenchMain is Main for a package of benchmarks only: a run that asks for
// none (`go test` without -bench, as `make test` runs every package) runs
// nothing and starts no stack.
func BenchMain(m *testing.M, st **stack.Stack, opts stack.Options) {
	flag.Parse()
	if flag.Lookup("test.bench").Value.String() == "" {
		os.Exit(m.Run())
	}
	Main(m, st, opts)
}

// Logger is what tests hand to the code under test: warnings and errors on
// stderr, everything when LABKEEP_TEST_VERBOSE is set.
func Logger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("LABKEEP_TEST_VERBOSE") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// Discard is a logger that drops everything.
func Discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Suffix returns 8 random hex characters, for names that must not collide
// between tests sharing a stack.
func Suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// CreateDatabase creates a new database on st's server, named after prefix
// and a random suffix, and returns its DSN with the given pool size.
func CreateDatabase(t testing.TB, st *stack.Stack, prefix string, poolMaxConns int) string {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, st.DSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	name := strings.ReplaceAll(prefix, "-", "_") + "_" + Suffix()
	if _, err := pool.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(st.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	q := u.Query()
	q.Set("pool_max_conns", fmt.Sprint(poolMaxConns))
	u.RawQuery = q.Encode()
	return u.String()
}

// Clock is an injectable clock: real time shifted by Advance, or frozen at
// a set instant. The zero value is real time. Safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	off    time.Duration
	frozen time.Time
}

// Now is the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen.IsZero() {
		return c.frozen
	}
	return time.Now().Add(c.off)
}

// Advance moves the clock forward by d (a frozen clock stays frozen, d later).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen.IsZero() {
		c.frozen = c.frozen.Add(d)
		return
	}
	c.off += d
}

// Set freezes the clock at t; the zero time unfreezes it (real time again,
// still shifted by earlier Advances).
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = t
}

// Refusal describes a server-side refusal to inject: the API server denies
// Operations on Resource (in Group) in Namespace whenever the CEL
// Expression is false — the same kind of refusal a webhook, quota or policy
// gives in production, without touching the code under test.
type Refusal struct {
	Name       string // of the ValidatingAdmissionPolicy and its binding
	Namespace  string
	Group      string
	Resource   string
	Operations []admissionv1.OperationType
	Expression string // CEL; the request is refused where it is false
	Message    string
	// Probe, if set, sends a server-side dry-run request the refusal must
	// refuse; Refuse returns only once it is refused.
	Probe func() error
}

// Refuse installs r as a ValidatingAdmissionPolicy and binding and removes
// them when the test ends. A new policy takes effect when the API server's
// policy cache next refreshes (about a second), so Refuse waits until
// r.Probe is refused; deleting a policy takes effect just as lazily, so
// prefer lifting a refusal through the object the Expression looks at.
func Refuse(t testing.TB, st *stack.Stack, r Refusal) {
	t.Helper()
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(st.Admin())
	if err != nil {
		t.Fatal(err)
	}
	adm := cs.AdmissionregistrationV1()
	fail := admissionv1.Fail
	_, err = adm.ValidatingAdmissionPolicies().Create(ctx, &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: r.Name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: r.Operations,
					Rule:       admissionv1.Rule{APIGroups: []string{r.Group}, APIVersions: []string{"*"}, Resources: []string{r.Resource}},
				},
			}}},
			Validations: []admissionv1.Validation{{Expression: r.Expression, Message: r.Message}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = adm.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: r.Name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        r.Name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": r.Namespace},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = adm.ValidatingAdmissionPolicyBindings().Delete(ctx, r.Name, metav1.DeleteOptions{})
		_ = adm.ValidatingAdmissionPolicies().Delete(ctx, r.Name, metav1.DeleteOptions{})
	})
	if r.Probe != nil {
		Eventually(t, 30*time.Second, func() (bool, string) {
			err := r.Probe()
			return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), fmt.Sprintf("refusal %s not in force: probe = %v", r.Name, err)
		})
	}
}
