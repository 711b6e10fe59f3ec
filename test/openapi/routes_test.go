package openapi_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"labkeep/shared/httpapi"
)

// handlerSources are the packages whose muxes make up the functions' HTTP
// routes (shared/portal serves static pages under /portal/, not the API).
var handlerSources = []string{"../../shared/httpapi", "../../shared/terminal"}

// catchAll are the patterns that answer every path nothing else serves
// (the JSON 404): no route of their own.
var catchAll = []string{"/", "/terminal/"}

// registered reads every route the handler packages register: each
// HandleFunc or Handle call on a mux with a literal pattern ("[METHOD
// ]/path"). A pattern without a method takes the one httpapi.Routes gives
// its path.
func registered(t *testing.T) map[string]string {
	t.Helper()
	methods := httpapi.Routes()
	out := map[string]string{}
	for _, dir := range handlerSources {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) != 2 {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				lit, isLit := call.Args[0].(*ast.BasicLit)
				if !ok || (sel.Sel.Name != "HandleFunc" && sel.Sel.Name != "Handle") || !isLit || lit.Kind != token.STRING {
					return true
				}
				pattern, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
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

// Every route the code registers is described with its method, and every
// described path is one the code registers: the description is the whole
// API, no more.
func TestEveryRegisteredRouteIsDescribed(t *testing.T) {
	doc := loadDescription(t)
	routes := registered(t)
	if len(routes) < len(httpapi.Routes()) {
		t.Fatalf("found %d registered routes in the source, fewer than httpapi.Routes' %d: %v", len(routes), len(httpapi.Routes()), routes)
	}
	for path, method := range routes {
		switch item := doc.Paths.Value(path); {
		case method == "":
			t.Errorf("%s is registered with no method in its pattern nor in httpapi.Routes", path)
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
	t.Logf("%d registered routes, all described", len(routes))
}
