package httpapi

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"
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
	http.StatusTooManyRequests:       "TooManyRequests",
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
	return enumStrings(s.AllOf[1].Value.Properties["error"].Value.Properties["code"].Value)
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
	slices.Sort(all)
	if diff := cmp.Diff(all, enum(t, doc, "ErrorCode", "")); diff != "" {
		t.Errorf("ErrorCode (-errors.go +openapi.yaml):\n%s", diff)
	}
}

// GET /openapi.yaml serves the description itself, without
// authentication.
func TestOpenAPIServed(t *testing.T) {
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
	return enumStrings(s)
}

// enumStrings is the enum of s, a list of strings, sorted.
func enumStrings(s *openapi3.Schema) []string {
	var out []string
	for _, e := range s.Enum {
		out = append(out, e.(string))
	}
	slices.Sort(out)
	return out
}

// sources parses the non-test Go files of the package in dir.
func sources(t *testing.T, dir string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// constants are the string values of every constant of type typ that the
// package in dir declares, sorted: a value added to the code and not to
// the description fails the test below.
func constants(t *testing.T, dir, typ string) []string {
	t.Helper()
	var out []string
	for _, f := range sources(t, dir) {
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.CONST {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != typ {
					continue
				}
				for _, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						out = append(out, s)
					}
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("no constant of type %s in %s", typ, dir)
	}
	slices.Sort(out)
	return out
}

// handlerSources are the packages whose muxes make up the functions' HTTP
// routes (shared/portal serves static pages under /portal/, not the API).
var handlerSources = []string{".", "../terminal"}

// catchAll are the patterns that answer every path nothing else serves
// (the JSON 404): no route of their own.
var catchAll = []string{"/", "/terminal/"}

// registered reads every route the handler packages register: each
// HandleFunc or Handle call with a literal pattern ("[METHOD ]/path"). A
// pattern without a method takes the one Routes gives its path.
func registered(t *testing.T) map[string]string {
	t.Helper()
	methods := Routes()
	out := map[string]string{}
	for _, dir := range handlerSources {
		for _, f := range sources(t, dir) {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) != 2 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				lit, isLit := call.Args[0].(*ast.BasicLit)
				if id, named := call.Args[0].(*ast.Ident); named && id.Obj != nil && id.Obj.Kind == ast.Con {
					// A path constant declared in the same file.
					if spec, ok := id.Obj.Decl.(*ast.ValueSpec); ok && len(spec.Values) == len(spec.Names) {
						lit, isLit = spec.Values[slices.IndexFunc(spec.Names, func(n *ast.Ident) bool { return n.Name == id.Name })].(*ast.BasicLit)
					}
				}
				if !ok || (sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle") || !isLit || lit.Kind != token.STRING {
					return true
				}
				pattern, _ := strconv.Unquote(lit.Value)
				method, path, ok := strings.Cut(pattern, " ")
				if !ok {
					method, path = methods[pattern], pattern
				}
				if !slices.Contains(catchAll, path) {
					out[path] = method
				}
				return true
			})
		}
	}
	return out
}

// Every route the code registers is described with its method (and only
// that one), and every described path is one the code registers: the
// description is the whole API, no more.
func TestOpenAPIDescribesEveryRegisteredRoute(t *testing.T) {
	doc := loadOpenAPI(t)
	routes := registered(t)
	if len(routes) < len(Routes()) {
		t.Fatalf("found %d registered routes in the source, fewer than Routes' %d: %v", len(routes), len(Routes()), routes)
	}
	for path, method := range routes {
		switch item := doc.Paths.Value(path); {
		case method == "":
			t.Errorf("%s is registered with no method in its pattern nor in Routes", path)
		case item == nil || item.GetOperation(method) == nil:
			t.Errorf("%s %s is registered but not described", method, path)
		case len(item.Operations()) != 1:
			t.Errorf("%s is described with %d operations; the code serves it with %s only", path, len(item.Operations()), method)
		}
	}
	for path := range doc.Paths.Map() {
		if _, ok := routes[path]; !ok {
			t.Errorf("%s is described but no handler registers it", path)
		}
	}
}

// The description's enums are the values the code declares.
func TestOpenAPIEnumsAreTheCodes(t *testing.T) {
	doc := loadOpenAPI(t)
	phases := []string{PhaseScheduled, PhaseUnschedulable, PhaseBooting, PhaseReady}
	slices.Sort(phases)
	// A session's statuses are its row's, and a place in the line reads
	// as one more.
	statuses := append(constants(t, "../session", "Status"), StatusQueued)
	slices.Sort(statuses)
	tests := []struct {
		name      string
		want, got []string
	}{
		{"session status", statuses, enum(t, doc, "SessionStatus", "")},
		{"lab kind", constants(t, "../labs", "Kind"), enum(t, doc, "LabKind", "")},
		{"node phase", phases, enum(t, doc, "Node", "phase")},
		{"reaper item kind", constants(t, "../reap", "ItemKind"), enum(t, doc, "ItemKind", "")},
		{"reaper trigger", constants(t, "../reap", "Trigger"), enum(t, doc, "Trigger", "")},
		{"alert severity", constants(t, "../../guardian/alert", "Severity"), enum(t, doc, "Severity", "")},
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
