package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"labkeep/guardian/guard"
)

// description is where guardian's API is described once, beside its
// server: openapi.yaml. labkeep's cleanup client (shared/terminal) reads
// the same file, so an answer guardian gives and labkeep would not read
// fails on one side or the other.
const description = "openapi.yaml"

// loadDescription loads and validates openapi.yaml (its examples
// included). Its alerts refer to labkeep's GuardianAlert schema, the one
// description of guardian's alert.
func loadDescription(t *testing.T) *openapi3.T {
	t.Helper()
	l := openapi3.NewLoader()
	l.IsExternalRefsAllowed = true
	doc, err := l.LoadFromFile(description)
	if err != nil {
		t.Fatalf("%s does not load: %v", description, err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("%s is not valid: %v", description, err)
	}
	return doc
}

// described returns the described response of method path with status.
func described(t *testing.T, doc *openapi3.T, method, path string, status int) *openapi3.Response {
	t.Helper()
	item := doc.Paths.Find(path)
	if item == nil || item.GetOperation(method) == nil {
		t.Fatalf("%s %s is not described", method, path)
	}
	ref := item.GetOperation(method).Responses.Status(status)
	if ref == nil || ref.Value == nil {
		t.Fatalf("%s %s answered %d, which is not described", method, path, status)
	}
	return ref.Value
}

// checkAnswer checks that resp and its body are a described answer of
// method path: a described status, its media type and, for JSON, a body
// its schema accepts. It returns the body as plain JSON values (nil for
// other media types).
func checkAnswer(t *testing.T, doc *openapi3.T, method, path string, resp *http.Response, body []byte) any {
	t.Helper()
	d := described(t, doc, method, path, resp.StatusCode)
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil {
		t.Fatalf("Content-Type %q: %v", resp.Header.Get("Content-Type"), err)
	}
	content := d.Content.Get(mt)
	if content == nil {
		t.Fatalf("%s %s %d answered %s; described: %v", method, path, resp.StatusCode, mt, slices.Sorted(maps.Keys(d.Content)))
	}
	if mt != "application/json" {
		return nil
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s %s %d: body is not JSON: %v: %s", method, path, resp.StatusCode, err, body)
	}
	if err := content.Schema.Value.VisitJSON(v); err != nil {
		t.Errorf("%s %s %d: body is not the described schema: %v\n%s", method, path, resp.StatusCode, err, body)
	}
	return v
}

// roundTrip sends req to srv and returns the response and its whole
// body, failing unless the status is want.
func roundTrip(t *testing.T, srv *httptest.Server, req *http.Request, want int) (*http.Response, []byte) {
	t.Helper()
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, want, body)
	}
	return resp, body
}

// cleanupBackend answers Cleanup with res and err.
type cleanupBackend struct {
	backend
	res guard.CleanupResult
	err error
}

func (b *cleanupBackend) Cleanup(context.Context) (guard.CleanupResult, error) { return b.res, b.err }

// Every answer of POST /cleanup is described: each behaviour's status,
// media type and body match the description, each described status is
// one of them, and where the description gives an example guardian
// answers exactly that.
func TestCleanupAnswersAreTheDescribedOnes(t *testing.T) {
	doc := loadDescription(t)
	tests := []struct {
		name           string
		method, token  string // token: the bearer token sent, none when empty
		configured     string // guardian's configured token
		res            guard.CleanupResult
		err            error
		wantStatus     int
		answersExample bool
	}{
		{name: "killed some, some not, with a note", method: http.MethodPost, token: "s3cret", configured: "s3cret",
			res:        guard.CleanupResult{Killed: []int{4242, 4243}, Failed: 1, Note: "unprotected processes remained after 3 rounds"},
			wantStatus: http.StatusOK, answersExample: true},
		{name: "killed nothing: an empty list, no note", method: http.MethodPost, token: "s3cret", configured: "s3cret",
			wantStatus: http.StatusOK},
		{name: "no token sent", method: http.MethodPost, configured: "s3cret",
			wantStatus: http.StatusUnauthorized, answersExample: true},
		{name: "wrong token", method: http.MethodPost, token: "s3cre", configured: "s3cret",
			wantStatus: http.StatusUnauthorized, answersExample: true},
		{name: "no token configured", method: http.MethodPost, token: "s3cret",
			wantStatus: http.StatusForbidden, answersExample: true},
		{name: "not POST", method: http.MethodGet, token: "s3cret", configured: "s3cret",
			wantStatus: http.StatusMethodNotAllowed},
		{name: "another emergency action runs", method: http.MethodPost, token: "s3cret", configured: "s3cret",
			err: guard.ErrBusy, wantStatus: http.StatusConflict, answersExample: true},
		{name: "cut short by the deadline", method: http.MethodPost, token: "s3cret", configured: "s3cret",
			err: context.DeadlineExceeded, wantStatus: http.StatusInternalServerError, answersExample: true},
		{name: "no workspace guarded", method: http.MethodPost, token: "s3cret", configured: "s3cret",
			err: guard.ErrNoWorkspace, wantStatus: http.StatusServiceUnavailable, answersExample: true},
	}
	answered := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(New(&cleanupBackend{res: tt.res, err: tt.err}, tt.configured, prometheus.NewRegistry(), nil))
			defer srv.Close()
			req, err := http.NewRequestWithContext(t.Context(), tt.method, srv.URL+"/cleanup", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			resp, body := roundTrip(t, srv, req, tt.wantStatus)
			answered[strconv.Itoa(resp.StatusCode)] = true
			got := checkAnswer(t, doc, http.MethodPost, "/cleanup", resp, body)
			if !tt.answersExample {
				return
			}
			example := described(t, doc, http.MethodPost, "/cleanup", resp.StatusCode).Content.Get("application/json").Example
			if diff := cmp.Diff(example, got); diff != "" {
				t.Errorf("answer against the described example (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("every described status is answered", func(t *testing.T) {
		var statuses []string
		for code := range doc.Paths.Find("/cleanup").Post.Responses.Map() {
			statuses = append(statuses, code)
		}
		if diff := cmp.Diff(slices.Sorted(slices.Values(statuses)), slices.Sorted(maps.Keys(answered))); diff != "" {
			t.Errorf("described statuses against those answered (-want +got):\n%s", diff)
		}
	})
}

// The description asks a bearer token of POST /cleanup and of nothing
// else, and no request body: guardian reads none.
func TestCleanupRequestIsTheDescribedOne(t *testing.T) {
	doc := loadDescription(t)
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			want := 0
			if method == http.MethodPost && path == "/cleanup" {
				want = 1
			}
			got := 0
			if op.Security != nil {
				got = len(*op.Security)
			}
			if got != want {
				t.Errorf("%s %s has %d security requirements, want %d", method, path, got, want)
			}
			if op.RequestBody != nil {
				t.Errorf("%s %s describes a request body; guardian reads none", method, path)
			}
		}
	}
	s := doc.Components.SecuritySchemes["cleanupToken"]
	if s == nil || s.Value == nil || s.Value.Type != "http" || s.Value.Scheme != "bearer" {
		t.Fatalf("cleanupToken is not an HTTP bearer scheme: %+v", s)
	}
}

// The other routes answer as described, for success and failure.
func TestOtherAnswersAreTheDescribedOnes(t *testing.T) {
	doc := loadDescription(t)
	stalled := errors.Join(errors.New("watch loop stalled"), guard.ErrUnhealthy)
	tests := []struct {
		name, path string
		b          *backend
		wantStatus int
	}{
		{"alerts", "/alerts", &backend{}, http.StatusOK},
		{"ready", "/healthz", &backend{}, http.StatusOK},
		{"not ready", "/healthz", &backend{health: stalled}, http.StatusServiceUnavailable},
		{"live", "/livez", &backend{}, http.StatusOK},
		{"not live", "/livez", &backend{live: stalled}, http.StatusServiceUnavailable},
		{"metrics", "/metrics", &backend{}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(New(tt.b, "s3cret", prometheus.NewRegistry(), nil))
			defer srv.Close()
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, body := roundTrip(t, srv, req, tt.wantStatus)
			checkAnswer(t, doc, http.MethodGet, tt.path, resp, body)
		})
	}
}
