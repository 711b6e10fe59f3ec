// Package labkeep_test keeps the package layout honest: domain packages own
// their types and import no adapter, adapters import the domain and never
// one another, the production tree never depends on local-development
// code, guardian's loops depend on no HTTP package, and guardian and
// labkeep (shared/, functions/) share no Go package: they meet only at the
// wire, described in the OpenAPI document. It reads the real import graph with
// `go list`, so a new import that breaks a rule fails here. The top level
// holds only the design card's entries.
package labkeep_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// pkg is one package of the module as go list reports it.
type pkg struct {
	path string
	// deps are every package it depends on, transitively (not its tests).
	deps []string
	// imports are what its files, test files included, import directly.
	imports []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-f",
		`{{.ImportPath}}|{{join .Deps " "}}|{{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`,
		"./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		pkgs = append(pkgs, pkg{path: f[0], deps: strings.Fields(f[1]), imports: strings.Fields(f[2])})
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; the module has more", len(pkgs))
	}
	return pkgs
}

func under(path string, prefixes ...string) bool {
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

func TestImportsRunOneWay(t *testing.T) {
	const m = "labkeep/"
	domain := []string{m + "shared/session", m + "shared/reap", m + "shared/lifetime", m + "shared/labs", m + "shared/setting", m + "shared/alerts", m + "shared/warmpool", m + "shared/access", m + "shared/seating", m + "shared/reservation", m + "shared/line", m + "shared/termlimit", m + "shared/workspacekey", m + "shared/rate"}
	adapters := []string{m + "shared/pgstore", m + "shared/kube", m + "shared/httpapi", m + "functions", m + "localrun", m + "test"}
	production := []string{m + "shared", m + "functions", m + "guardian", m + "infra"}
	// The edges: each serves or reaches one outside system (PostgreSQL,
	// the Kubernetes API, HTTP clients, the browser). The entry points
	// (functions/...) wire them together and may import them all.
	edges := []string{m + "shared/pgstore", m + "shared/kube", m + "shared/httpapi", m + "shared/terminal", m + "shared/portal"}
	labkeep := []string{m + "shared", m + "functions"}
	// depsAndTests is everything p's code depends on and everything its
	// files, tests included, import.
	depsAndTests := func(p pkg) []string { return append(slices.Clone(p.deps), p.imports...) }
	rules := []struct {
		name   string
		from   func(p pkg) bool
		edges  func(p pkg) []string
		banned []string
	}{
		{"domain packages never depend on an adapter",
			func(p pkg) bool { return under(p.path, domain...) },
			func(p pkg) []string { return p.deps }, adapters},
		// The one exception: guardian's end-to-end benchmarks (a package of
		// test files only) record their table rows through
		// localrun/benchtable, which imports nothing of labkeep.
		{"nothing outside localrun/ and test/ imports localrun, not even in tests",
			func(p pkg) bool { return !under(p.path, m+"localrun", m+"test") },
			func(p pkg) []string {
				if p.path != m+"guardian/e2e" {
					return p.imports
				}
				return slices.DeleteFunc(slices.Clone(p.imports), func(d string) bool { return d == m+"localrun/benchtable" })
			}, []string{m + "localrun", m + "test"}},
		{"the production tree never depends on localrun or test",
			func(p pkg) bool { return under(p.path, production...) },
			func(p pkg) []string { return p.deps }, []string{m + "localrun", m + "test"}},
		{"guardian's loops import no HTTP package",
			func(p pkg) bool { return p.path == m+"guardian/guard" },
			func(p pkg) []string { return p.imports }, []string{"net/http", m + "guardian/httpapi"}},
		{"labkeep (shared/, functions/) never depends on guardian, not even in tests",
			func(p pkg) bool { return under(p.path, labkeep...) },
			depsAndTests, []string{m + "guardian"}},
		{"guardian never depends on labkeep (shared/, functions/), not even in tests",
			func(p pkg) bool { return under(p.path, m+"guardian") },
			depsAndTests, labkeep},
		// Tests may wire real edges together, as the entry points do (the
		// terminal's refusals are checked through httpapi's table).
		{"no edge adapter's code depends on another edge adapter",
			func(p pkg) bool { return under(p.path, edges...) },
			func(p pkg) []string {
				return slices.DeleteFunc(slices.Clone(p.deps), func(d string) bool {
					for _, e := range edges {
						if under(p.path, e) && under(d, e) {
							return true // within its own adapter
						}
					}
					return false
				})
			}, edges},
		{"guardian's loops never depend on their HTTP adapter",
			func(p pkg) bool { return p.path == m+"guardian/guard" },
			func(p pkg) []string { return p.deps }, []string{m + "guardian/httpapi"}},
	}
	pkgs := listPackages(t)
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			checked := 0
			for _, p := range pkgs {
				if !r.from(p) {
					continue
				}
				checked++
				for _, d := range r.edges(p) {
					if under(d, r.banned...) {
						t.Errorf("%s depends on %s", p.path, d)
					}
				}
			}
			if checked == 0 {
				t.Fatal("the rule matched no package: it checks nothing")
			}
		})
	}
}

// designCard is the project's top level: everything that deploys labkeep
// lives under infra/, documentation beside what it documents.
var designCard = []string{"Makefile", "README.md", "functions", "go.mod", "go.sum", "guardian", "infra",
	"layout_test.go", "localrun", "shared", "test"}

// The top level holds exactly the design card's entries (this file
// included), plus dot-files.
func TestTopLevelIsTheDesignCard(t *testing.T) {
	out, err := exec.Command("git", "ls-tree", "--name-only", "HEAD").Output()
	if err != nil {
		t.Fatalf("git ls-tree: %v", err)
	}
	var got []string
	for _, name := range strings.Fields(string(out)) {
		if !strings.HasPrefix(name, ".") {
			got = append(got, name)
		}
	}
	slices.Sort(got)
	if !slices.Equal(designCard, got) {
		t.Errorf("top level = %v; want %v", got, designCard)
	}
}
