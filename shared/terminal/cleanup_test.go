package terminal

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/workspacekey"
)

// guardianDescription is where guardian's API, POST /cleanup included, is
// described once: beside guardian's server. labkeep shares no Go package
// with guardian; it reads the description itself, so a request guardian
// would refuse or an answer labkeep would misread fails here.
var guardianDescription = filepath.Join("..", "..", "guardian", "httpapi", "openapi.yaml")

// cleanupOperation returns the described POST /cleanup and the document.
func cleanupOperation(t *testing.T) (*openapi3.T, *openapi3.Operation) {
	t.Helper()
	l := openapi3.NewLoader()
	l.IsExternalRefsAllowed = true // its alerts refer to labkeep's GuardianAlert
	doc, err := l.LoadFromFile(guardianDescription)
	if err != nil {
		t.Fatalf("guardian's description does not load: %v", err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("guardian's description is not valid: %v", err)
	}
	item := doc.Paths.Find("/cleanup")
	if item == nil || item.Post == nil {
		t.Fatal("guardian's description has no POST /cleanup")
	}
	return doc, item.Post
}

// fakeGuardian answers every request with one status and body and keeps
// the requests it received.
type fakeGuardian struct {
	status      int
	contentType string
	body        []byte

	mu   sync.Mutex
	reqs []receivedRequest
}

type receivedRequest struct {
	method, path, authorization, contentType string
	body                                     string
}

func (f *fakeGuardian) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, receivedRequest{method: r.Method, path: r.URL.Path, authorization: r.Header.Get("Authorization"),
		contentType: r.Header.Get("Content-Type"), body: string(b)})
	f.mu.Unlock()
	w.Header().Set("Content-Type", f.contentType)
	w.WriteHeader(f.status)
	w.Write(f.body)
}

func (f *fakeGuardian) received() []receivedRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

// cleanupKey is the workspace key of the tests' guardians, and
// cleanupSession the session whose workspace they guard.
var cleanupKey = workspacekey.Key{Secret: []byte("0123456789abcdef0123456789abcdef"), Env: "dev"}

const cleanupSession = "6f1c9f0e-8a51-4d7e-9a43-0e4f2b7c1d20"

// callCleanup runs Guardian.Cleanup for cleanupSession against h, served as
// the guardian of its workspace Pod.
func callCleanup(t *testing.T, h http.Handler) (CleanupReport, error) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	host, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	kc := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ws", Namespace: "sessions"},
			Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: "guardian",
				Ports: []corev1.ContainerPort{{Name: labs.GuardianAPIPort, ContainerPort: int32(p)}}}}},
			Status: corev1.PodStatus{PodIP: host}},
	)
	return NewGuardian(kc, "sessions", cleanupKey, 10*time.Second).Cleanup(t.Context(), cleanupSession, "ws")
}

// The request the client sends is the described one: POST /cleanup, the
// described bearer scheme carrying the session's own cleanup token, and
// no body, as the description asks none.
func TestCleanupSendsTheDescribedRequest(t *testing.T) {
	doc, op := cleanupOperation(t)
	if op.RequestBody != nil {
		t.Fatal("guardian's description now asks a request body; the client sends none")
	}
	if op.Security == nil || len(*op.Security) != 1 {
		t.Fatalf("POST /cleanup describes security %v; the client sends one bearer token", op.Security)
	}
	var scheme string
	for name := range (*op.Security)[0] {
		scheme = name
	}
	s := doc.Components.SecuritySchemes[scheme]
	if s == nil || s.Value == nil || s.Value.Type != "http" || !strings.EqualFold(s.Value.Scheme, "bearer") {
		t.Fatalf("POST /cleanup's security %q is not an HTTP bearer scheme", scheme)
	}
	ok := op.Responses.Status(http.StatusOK).Value.Content.Get("application/json")
	example, err := json.Marshal(ok.Example)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeGuardian{status: http.StatusOK, contentType: "application/json", body: example}
	if _, err := callCleanup(t, f); err != nil {
		t.Fatal(err)
	}
	want := []receivedRequest{{method: http.MethodPost, path: "/cleanup",
		authorization: "Bearer " + cleanupKey.Token(workspacekey.Cleanup, cleanupSession)}}
	if diff := cmp.Diff(want, f.received(), cmp.AllowUnexported(receivedRequest{})); diff != "" {
		t.Errorf("requests guardian received (-want +got):\n%s", diff)
	}
}

// Each described answer of POST /cleanup, served as its example, is read
// as the description means it: 200 as the report, every other status as
// a bad gateway carrying guardian's own words.
func TestCleanupReadsTheDescribedAnswers(t *testing.T) {
	_, op := cleanupOperation(t)
	tests := []struct {
		name       string
		status     int
		wantReport CleanupReport
		wantErr    string // the error's text after guardian's status, for refusals
	}{
		{name: "the report", status: http.StatusOK,
			wantReport: CleanupReport{Killed: []int{4242, 4243}, Failed: 1, Note: "unprotected processes remained after 3 rounds"}},
		{name: "missing or wrong token", status: http.StatusUnauthorized, wantErr: "missing or wrong bearer token"},
		{name: "cleanup disabled", status: http.StatusForbidden, wantErr: "cleanup is disabled: no token configured"},
		{name: "a method guardian does not serve", status: http.StatusMethodNotAllowed, wantErr: ""},
		{name: "another emergency action runs", status: http.StatusConflict, wantErr: "another emergency action is running"},
		{name: "cut short", status: http.StatusInternalServerError, wantErr: "context deadline exceeded"},
		{name: "no workspace guarded", status: http.StatusServiceUnavailable, wantErr: "no workspace cgroup guarded"},
	}
	var covered []string
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			covered = append(covered, strconv.Itoa(tt.status))
			ref := op.Responses.Status(tt.status)
			if ref == nil || ref.Value == nil {
				t.Fatalf("%d is not a described answer", tt.status)
			}
			var mt string
			for k := range ref.Value.Content {
				mt = k
			}
			example := ref.Value.Content[mt].Example
			body, ok := example.(string)
			if !ok {
				b, err := json.Marshal(example)
				if err != nil {
					t.Fatal(err)
				}
				body = string(b)
			}
			got, err := callCleanup(t, &fakeGuardian{status: tt.status, contentType: mt, body: []byte(body)})
			if tt.status == http.StatusOK {
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.wantReport, got); diff != "" {
					t.Errorf("report (-want +got):\n%s", diff)
				}
				return
			}
			if !errors.Is(err, access.ErrBadGateway) {
				t.Fatalf("error %v is no bad gateway", err)
			}
			want := "guardian answered " + strconv.Itoa(tt.status) + ": " + tt.wantErr
			if !strings.HasSuffix(err.Error(), want) {
				t.Errorf("error %q does not end in %q", err, want)
			}
		})
	}
	t.Run("every described answer is read", func(t *testing.T) {
		var described []string
		for code := range op.Responses.Map() {
			described = append(described, code)
		}
		if diff := cmp.Diff(slices.Sorted(slices.Values(described)), slices.Sorted(slices.Values(covered))); diff != "" {
			t.Errorf("described statuses against those tested (-want +got):\n%s", diff)
		}
	})
}

// The report's JSON names are the described report's properties, plus
// the session labkeep adds for its own caller; a report killing nothing
// reads as an empty list, as described.
func TestCleanupReportIsTheDescribedReport(t *testing.T) {
	doc, _ := cleanupOperation(t)
	ref := doc.Components.Schemas["CleanupReport"]
	if ref == nil || ref.Value == nil {
		t.Fatal("guardian's description has no CleanupReport schema")
	}
	var described []string
	for p := range ref.Value.Properties {
		described = append(described, p)
	}
	var read []string
	for f := range reflect.TypeFor[CleanupReport]().Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "session" {
			read = append(read, name)
		}
	}
	if diff := cmp.Diff(slices.Sorted(slices.Values(described)), slices.Sorted(slices.Values(read))); diff != "" {
		t.Errorf("described properties against the client's JSON names (-want +got):\n%s", diff)
	}
	got, err := callCleanup(t, &fakeGuardian{status: http.StatusOK, contentType: "application/json", body: []byte(`{"killed":[],"failed":0}`)})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(CleanupReport{Killed: []int{}}, got); diff != "" {
		t.Errorf("report of a cleanup that killed nothing (-want +got):\n%s", diff)
	}
}

// Whatever answers at the workspace Pod's address may be the workspace's
// root in guardian's place, so a redirect is never followed, whatever its
// status: the target is never asked (the token never leaves for it) and
// the cleanup fails as a bad gateway naming the redirect.
func TestCleanupFollowsNoRedirect(t *testing.T) {
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			target := &fakeGuardian{status: http.StatusOK, contentType: "application/json", body: []byte(`{"killed":[],"failed":0}`)}
			srv := httptest.NewServer(target)
			defer srv.Close()
			bounce := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, srv.URL+"/cleanup", status)
			})
			_, err := callCleanup(t, bounce)
			if !errors.Is(err, access.ErrBadGateway) || !strings.Contains(err.Error(), "redirect") {
				t.Errorf("error %v, want a bad gateway naming the redirect", err)
			}
			if diff := cmp.Diff([]receivedRequest(nil), target.received(), cmp.AllowUnexported(receivedRequest{})); diff != "" {
				t.Errorf("requests the redirect's target received (-want +got):\n%s", diff)
			}
		})
	}
}

// Without a workspace key there is no token to send: the call fails
// before anything is asked of the cluster or the Pod (the fake cluster
// holds no Pod, so any further step would fail differently).
func TestCleanupWithoutAKeySendsNothing(t *testing.T) {
	_, err := NewGuardian(fake.NewClientset(), "sessions", workspacekey.Key{}, time.Second).Cleanup(t.Context(), cleanupSession, "ws")
	if err == nil || !strings.Contains(err.Error(), "no workspace key") {
		t.Errorf("Cleanup without a key = %v, want the missing key named", err)
	}
}
