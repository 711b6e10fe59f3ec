package reap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"labkeep/functions/app"
	"labkeep/functions/lambda"
	"labkeep/infra"
	"labkeep/localrun/controlplane"
	"labkeep/localrun/stacktest"
	"labkeep/shared/httpapi"
	"labkeep/shared/kube"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

const (
	jwtSecret      = "reap-test-secret-0123456789abcdef0123"
	schedulerToken = "scheduler-token-for-tests"
)

// refuseAnnotation marks a VM whose deletion the API server must refuse.
const refuseAnnotation = "labkeep.test/refuse-delete"

// refuseDeletes makes the real API server refuse to delete the VMs of one
// session — a server-side refusal, like RBAC denying that one object. A
// ValidatingAdmissionPolicy refuses DELETE of any VM annotated
// refuseAnnotation, and the session's VMs get the annotation. The returned
// func lifts the refusal by removing the annotation, which takes effect at
// once (deleting a policy takes effect only when the API server's policy
// cache next refreshes).
func refuseDeletes(t *testing.T, ns, sessionID string) func() {
	t.Helper()
	ctx := context.Background()
	cs, dyn := admin(t)
	adm := cs.AdmissionregistrationV1()
	name := "refuse-delete-" + ns
	fail := admissionv1.Fail
	_, err := adm.ValidatingAdmissionPolicies().Create(ctx, &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Delete},
					Rule:       admissionv1.Rule{APIGroups: []string{"kubevirt.io"}, APIVersions: []string{"*"}, Resources: []string{"virtualmachines"}},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: `!has(oldObject.metadata.annotations) || !('` + refuseAnnotation + `' in oldObject.metadata.annotations)`,
				Message:    "injected fault: deleting this VM is refused",
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = adm.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = adm.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = adm.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	})
	vms, err := dyn.Resource(gvrs["VirtualMachine"]).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelSession + "=" + sessionID})
	if err != nil || len(vms.Items) == 0 {
		t.Fatalf("no VM of session %s to guard: %v", sessionID, err)
	}
	annotate := func(value any) {
		for _, vm := range vms.Items {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{refuseAnnotation: value}}})
			if _, err := dyn.Resource(gvrs["VirtualMachine"]).Namespace(ns).Patch(ctx, vm.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatalf("annotating VM %s: %v", vm.GetName(), err)
			}
		}
	}
	annotate("true")
	eventually(t, "delete refusal in force", func() bool {
		err := dyn.Resource(gvrs["VirtualMachine"]).Namespace(ns).Delete(ctx, vms.Items[0].GetName(), metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err)
	})
	return func() {
		annotate(nil) // a merge patch with null removes the annotation
		if err := dyn.Resource(gvrs["VirtualMachine"]).Namespace(ns).Delete(ctx, vms.Items[0].GetName(), metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatalf("delete still refused after lifting: %v", err)
		}
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// httpBackend is the functions as deployed: app.Build from a Config, the
// ServiceAccount's kubeconfig, served over HTTP.
type httpBackend struct {
	*backend
	app *app.App
	srv *httptest.Server
}

func newHTTPBackend(t *testing.T) *httpBackend {
	t.Helper()
	b := newBackend(t, backendOptions{})
	ctx := context.Background()
	dir := t.TempDir()
	fnNS := b.env + "-http-fn"
	if err := infra.Apply(ctx, st.Admin(), infra.Placement{Functions: fnNS, Sessions: b.ns}, "namespaces.yaml", "rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	cs, _ := admin(t)
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), fnNS, metav1.DeleteOptions{}) })
	sa, err := st.CP.ServiceAccountConfig(ctx, fnNS, infra.ServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	// The shipped RoleBinding names the first functions namespace; bind this
	// one too (same Role).
	bindExtra(t, b.ns, fnNS)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(kubeconfig, sa, "labkeep-functions"); err != nil {
		t.Fatal(err)
	}
	labsYAML, _ := infra.File("labs.yaml")
	labsFile := filepath.Join(dir, "labs.yaml")
	if err := os.WriteFile(labsFile, labsYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := app.Config{
		Env: b.env, DatabaseURL: b.store.Pool().Config().ConnString(), Namespace: b.ns,
		SessionLifetime: time.Hour, SessionMaxLifetime: 3 * time.Hour, DeadlineGrace: 15 * time.Minute,
		MaxConcurrentVms: 8, LabsFile: labsFile, JWTSecret: jwtSecret, Kubeconfig: kubeconfig,
		KubeTimeout: 10 * time.Second, AnchorImage: "registry.k8s.io/pause:3.10", GuardianImage: "labkeep/guardian:test",
		SchedulerToken: schedulerToken,
	}
	a, err := app.Build(ctx, cfg, b.clock.Now, stacktest.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return &httpBackend{backend: b, app: a, srv: srv}
}

type reply struct {
	status int
	body   []byte
	code   string
}

func (h *httpBackend) call(method, path, auth, ctype, body string) reply {
	h.t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", "Bearer "+auth)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	r := reply{status: res.StatusCode}
	r.body, _ = io.ReadAll(res.Body)
	var eb struct {
		Error struct{ Code string } `json:"error"`
	}
	if json.Unmarshal(r.body, &eb) == nil {
		r.code = eb.Error.Code
	}
	return r
}

func (h *httpBackend) jwt(sub, role string) string {
	h.t.Helper()
	// Expiry is judged by the functions' (advanced) clock.
	tok, err := httpapi.Sign([]byte(jwtSecret), sub, role, h.clock.Now().Add(24*time.Hour))
	if err != nil {
		h.t.Fatal(err)
	}
	return tok
}

type runJSON struct {
	Trigger  string         `json:"trigger"`
	Counts   map[string]int `json:"counts"`
	Failures []struct {
		Kind, Session, Error string
	} `json:"failures"`
}

// The reaper's endpoints on the deployed handler: reapTick with any
// scheduler payload, adminStatus showing a row that fails every run,
// adminReapNow, /metrics, busy, and a bad-input matrix that changes nothing.
func TestReaperEndpoints(t *testing.T) {
	h := newHTTPBackend(t)
	stuck := h.open("s-stuck", "linux-vm")
	other := h.open("s-other", "linux-vm")
	h.clock.Advance(61 * time.Minute)
	lift := refuseDeletes(t, h.ns, stuck.ID)

	payloads := []struct{ name, ctype, body string }{
		{"CloudEvent (Knative PingSource)", "application/cloudevents+json", `{"specversion":"1.0","type":"dev.knative.sources.ping","source":"/apis/v1/namespaces/labkeep/pingsources/reap","id":"1","data":{}}`},
		{"EventBridge scheduled event", "application/json", `{"version":"0","id":"x","detail-type":"Scheduled Event","source":"aws.events","detail":{}}`},
		{"empty body", "", ""},
	}
	for i, p := range payloads {
		r := h.call("POST", "/reapTick", schedulerToken, p.ctype, p.body)
		if r.status != 200 {
			t.Fatalf("reapTick with %s: %d %s", p.name, r.status, r.body)
		}
		var run runJSON
		if err := json.Unmarshal(r.body, &run); err != nil {
			t.Fatal(err)
		}
		wantExpired := 0
		if i == 0 {
			wantExpired = 1 // the other session, at the first run
		}
		if run.Trigger != "schedule" || run.Counts["expired"] != wantExpired || len(run.Failures) != 1 || run.Failures[0].Session != stuck.ID {
			t.Fatalf("reapTick %d (%s): %s", i, p.name, r.body)
		}
	}
	if got := h.status(other.ID); got != session.StatusExpired {
		t.Fatalf("the other session is %s", got)
	}

	r := h.call("GET", "/adminStatus", h.jwt("ops", "admin"), "", "")
	if r.status != 200 {
		t.Fatalf("adminStatus: %d %s", r.status, r.body)
	}
	var status reap.Status
	if err := json.Unmarshal(r.body, &status); err != nil {
		t.Fatal(err)
	}
	if len(status.FailingSessions) != 1 || status.FailingSessions[0].Session != stuck.ID || status.FailingSessions[0].RunsInARow != 3 ||
		status.FailureCounts["expired"] != 3 || status.LiveSessions != 1 || status.LiveVMs != 1 || status.Capacity != (reap.Capacity{Used: 1, Limit: 8}) || len(status.RecentRuns) != 3 {
		t.Fatalf("adminStatus does not show the row failing every run: %s", r.body)
	}

	// Bad input: nothing runs, nothing changes.
	rowsBefore := h.count("SELECT count(*) FROM reap_runs")
	objsBefore := objectsIn(t, h.ns, "")
	bad := []struct {
		name, method, path, auth, ctype, body string
		status                                int
		code                                  string
	}{
		{"reapTick without a token", "POST", "/reapTick", "", "", "", 401, "unauthorized"},
		{"reapTick with a wrong token", "POST", "/reapTick", "not-the-token", "", "", 401, "unauthorized"},
		{"reapTick with an admin JWT instead of the scheduler token", "POST", "/reapTick", h.jwt("ops", "admin"), "", "", 401, "unauthorized"},
		{"reapTick with GET", "GET", "/reapTick", schedulerToken, "", "", 405, "method_not_allowed"},
		{"adminReapNow without auth", "POST", "/adminReapNow", "", "", "", 401, "unauthorized"},
		{"adminReapNow as a student", "POST", "/adminReapNow", h.jwt("s-stuck", "student"), "", "", 403, "forbidden"},
		{"adminReapNow with an unknown field", "POST", "/adminReapNow", h.jwt("ops", "admin"), "application/json", `{"force":true}`, 400, "bad_request"},
		{"adminReapNow with a text body", "POST", "/adminReapNow", h.jwt("ops", "admin"), "text/plain", `go`, 415, "unsupported_media_type"},
		{"adminReapNow with an oversized body", "POST", "/adminReapNow", h.jwt("ops", "admin"), "application/json", `{"x":"` + strings.Repeat("a", 70<<10) + `"}`, 413, "too_large"},
		{"adminStatus as a student", "GET", "/adminStatus", h.jwt("s-other", "student"), "", "", 403, "forbidden"},
		{"adminStatus with POST", "POST", "/adminStatus", h.jwt("ops", "admin"), "", "", 405, "method_not_allowed"},
		{"adminStatus with an expired JWT", "GET", "/adminStatus", h.expiredJWT(), "", "", 401, "unauthorized"},
	}
	for _, tc := range bad {
		r := h.call(tc.method, tc.path, tc.auth, tc.ctype, tc.body)
		if r.status != tc.status || r.code != tc.code {
			t.Errorf("%s: got %d %q, want %d %q (%s)", tc.name, r.status, r.code, tc.status, tc.code, r.body)
		}
	}
	if n := h.count("SELECT count(*) FROM reap_runs"); n != rowsBefore {
		t.Fatalf("bad requests recorded %d runs", n-rowsBefore)
	}
	if objs := objectsIn(t, h.ns, ""); !slices.Equal(objs, objsBefore) {
		t.Fatalf("bad requests changed the namespace: %v -> %v", objsBefore, objs)
	}

	// Busy: another run holds the lock.
	unlock, ok, err := h.store.TryLock(context.Background(), reap.LockName)
	if err != nil || !ok {
		t.Fatalf("take the reaper lock: ok=%v err=%v", ok, err)
	}
	r = h.call("POST", "/adminReapNow", h.jwt("ops", "admin"), "", "")
	unlock()
	if r.status != 409 || r.code != "busy" {
		t.Fatalf("adminReapNow while another run holds the lock: %d %s", r.status, r.body)
	}

	lift()
	r = h.call("POST", "/adminReapNow", h.jwt("ops", "admin"), "", "")
	var run runJSON
	if err := json.Unmarshal(r.body, &run); err != nil || r.status != 200 || run.Trigger != "admin" || run.Counts["expired"] != 1 || len(run.Failures) != 0 {
		t.Fatalf("adminReapNow after the fault is lifted: %d %s", r.status, r.body)
	}
	h.waitGone(stuck.ID, 30*time.Second)

	r = h.call("GET", "/metrics", "", "", "")
	for _, want := range []string{
		`labkeep_reap_runs_total{result="ok",trigger="schedule"} 3`,
		`labkeep_reap_runs_total{result="ok",trigger="admin"} 1`,
		`labkeep_reap_runs_total{result="busy",trigger="admin"} 1`,
		`labkeep_reaped_items_total{kind="expired"} 2`,
		`labkeep_reap_failures_total{kind="expired"} 3`,
		`labkeep_live_sessions 1`,
		`labkeep_reap_run_duration_seconds_count 4`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func (h *httpBackend) expiredJWT() string {
	h.t.Helper()
	tok, err := httpapi.Sign([]byte(jwtSecret), "ops", "admin", h.clock.Now().Add(-time.Minute))
	if err != nil {
		h.t.Fatal(err)
	}
	return tok
}

// bindExtra binds the shipped Role in ns to the functions ServiceAccount of
// another functions namespace.
func bindExtra(t *testing.T, ns, fnNS string) {
	t.Helper()
	if err := bindRole(ns, fnNS); err != nil {
		t.Fatal(fmt.Errorf("binding %s: %w", fnNS, err))
	}
}

// An EventBridge schedule invoking the Lambda shim runs the real reaper
// through the same handler (the shim only adapts the event).
func TestReapTickThroughLambdaShim(t *testing.T) {
	h := newHTTPBackend(t)
	s := h.open("s-lambda", "linux-vm")
	h.clock.Advance(61 * time.Minute)
	adapter := lambda.Adapter{Handler: h.app.Handler(), ScheduledPath: "/reapTick", SchedulerToken: schedulerToken}
	event := json.RawMessage(`{"version":"0","id":"53dc4d37","detail-type":"Scheduled Event","source":"aws.events","account":"123456789012","time":"2026-11-30T12:00:00Z","region":"eu-west-1","resources":["arn:aws:events:eu-west-1:123456789012:rule/labkeep-reap"],"detail":{}}`)
	res, err := adapter.Invoke(context.Background(), event)
	if err != nil {
		t.Fatal(err)
	}
	var run runJSON
	if res.StatusCode != 200 || json.Unmarshal([]byte(res.Body), &run) != nil || run.Counts["expired"] != 1 {
		t.Fatalf("EventBridge invocation: %d %s", res.StatusCode, res.Body)
	}
	if got := h.status(s.ID); got != session.StatusExpired {
		t.Fatalf("session is %s after the scheduled Lambda run", got)
	}
	h.waitGone(s.ID, 30*time.Second)
	// A shim configured with the wrong token is refused like any caller.
	adapter.SchedulerToken = "wrong"
	res, err = adapter.Invoke(context.Background(), event)
	if err != nil || res.StatusCode != 401 {
		t.Fatalf("wrong scheduler token through the shim: %d %v", res.StatusCode, err)
	}
}
