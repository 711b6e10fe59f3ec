package httpapi

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"

	"labkeep/guardian/alert"
	"labkeep/shared/labs"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// loadOpenAPI loads and validates the embedded description.
func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(OpenAPI)
	if err != nil {
		t.Fatalf("openapi.yaml does not load: %v", err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI description: %v", err)
	}
	return doc
}

func TestOpenAPIIsValid(t *testing.T) {
	doc := loadOpenAPI(t)
	if doc.Paths.Len() == 0 {
		t.Fatal("openapi.yaml describes no path")
	}
}

// errorResponses names the description's error response of each status.
var errorResponses = map[int]string{
	http.StatusBadRequest:            "BadRequest",
	http.StatusUnauthorized:          "Unauthorized",
	http.StatusForbidden:             "Forbidden",
	http.StatusNotFound:              "NotFound",
	http.StatusMethodNotAllowed:      "MethodNotAllowed",
	http.StatusConflict:              "Conflict",
	http.StatusRequestEntityTooLarge: "TooLarge",
	http.StatusUnsupportedMediaType:  "UnsupportedMediaType",
	http.StatusInternalServerError:   "Internal",
	http.StatusBadGateway:            "BadGateway",
	http.StatusServiceUnavailable:    "NoCapacity",
}

// responseCodes are the error codes the description allows in response
// name (the enum of its second allOf schema).
func responseCodes(t *testing.T, doc *openapi3.T, name string) []string {
	t.Helper()
	ref := doc.Components.Responses[name]
	if ref == nil || ref.Value == nil {
		t.Fatalf("no response component %s", name)
	}
	s := ref.Value.Content.Get("application/json").Schema.Value
	code := s.AllOf[1].Value.Properties["error"].Value.Properties["code"].Value
	var codes []string
	for _, e := range code.Enum {
		codes = append(codes, e.(string))
	}
	slices.Sort(codes)
	return codes
}

// The description's error codes are errors.go's, each under the status
// its table gives it: one table, described once.
func TestOpenAPIErrorsAreTheStatusTable(t *testing.T) {
	doc := loadOpenAPI(t)
	want := map[string][]string{errorResponses[http.StatusInternalServerError]: {"internal"}}
	all := []string{"internal"}
	for _, row := range statusTable {
		name, ok := errorResponses[row.status]
		if !ok {
			t.Fatalf("status %d of %s has no response in the description", row.status, row.err)
		}
		want[name] = append(want[name], row.err.Error())
		all = append(all, row.err.Error())
	}
	for name := range want {
		slices.Sort(want[name])
		if diff := cmp.Diff(want[name], responseCodes(t, doc, name)); diff != "" {
			t.Errorf("error codes of response %s (-errors.go +openapi.yaml):\n%s", name, diff)
		}
	}
	var enum []string
	for _, e := range doc.Components.Schemas["ErrorCode"].Value.Enum {
		enum = append(enum, e.(string))
	}
	slices.Sort(all)
	slices.Sort(enum)
	if diff := cmp.Diff(all, enum); diff != "" {
		t.Errorf("ErrorCode (-errors.go +openapi.yaml):\n%s", diff)
	}
}

// Every route of Routes is described with its method, and GET
// /openapi.yaml serves the description itself, without authentication.
func TestOpenAPIServedAndCoversRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	for path, method := range Routes() {
		item := doc.Paths.Value(path)
		if item == nil || item.GetOperation(method) == nil {
			t.Errorf("%s %s is served but not described in openapi.yaml", method, path)
		}
	}
	a := New(Options{})
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.yaml", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != string(OpenAPI) || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/yaml") {
		t.Errorf("GET /openapi.yaml = %d %q, %d bytes; want 200 application/yaml, the embedded description", rec.Code, rec.Header().Get("Content-Type"), rec.Body.Len())
	}
}

// enum is the description's enum of schema name (or of its property
// prop), sorted.
func enum(t *testing.T, doc *openapi3.T, name, prop string) []string {
	t.Helper()
	s := doc.Components.Schemas[name].Value
	if prop != "" {
		s = s.Properties[prop].Value
	}
	var out []string
	for _, e := range s.Enum {
		out = append(out, e.(string))
	}
	slices.Sort(out)
	return out
}

// The description's enums are the values the code writes.
func TestOpenAPIEnumsAreTheCodes(t *testing.T) {
	doc := loadOpenAPI(t)
	sorted := func(s ...string) []string { slices.Sort(s); return s }
	tests := []struct {
		name      string
		want, got []string
	}{
		{"session status", sorted(string(session.StatusQueued), string(session.StatusProvisioning), string(session.StatusRunning),
			string(session.StatusExpired), string(session.StatusFailed), string(session.StatusClosed)), enum(t, doc, "SessionStatus", "")},
		{"lab kind", sorted(string(labs.KindVM), string(labs.KindPod)), enum(t, doc, "LabKind", "")},
		{"node phase", sorted(PhaseScheduled, PhaseBooting, PhaseReady), enum(t, doc, "Node", "phase")},
		{"reaper item kind", sorted(string(reap.Expired), string(reap.Orphan), string(reap.Ghost),
			string(reap.FailedInventory), string(reap.FailedRetention), string(reap.FailedSuspects)), enum(t, doc, "ItemKind", "")},
		{"reaper trigger", sorted(string(reap.TriggerSchedule), string(reap.TriggerAdmin)), enum(t, doc, "Trigger", "")},
		{"alert severity", sorted(string(alert.Info), string(alert.Warning), string(alert.Critical)), enum(t, doc, "Severity", "")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.got); diff != "" {
				t.Errorf("(-code +openapi.yaml):\n%s", diff)
			}
		})
	}
	counts := slices.Sorted(maps.Keys(doc.Components.Schemas["Counts"].Value.Properties))
	if diff := cmp.Diff(enum(t, doc, "ItemKind", ""), counts); diff != "" {
		t.Errorf("Counts' properties are not the item kinds (-ItemKind +Counts):\n%s", diff)
	}
}
