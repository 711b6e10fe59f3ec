package guard

import (
	"os/exec"
	"strings"
	"testing"
)

// The loops must not know their HTTP adapter: httpapi depends on guard,
// never the reverse, and guard itself speaks no HTTP. The only guardian
// package below guard allowed to use net/http is alert, whose webhook
// delivery is HTTP by nature.
func TestGuardImportsNoHTTP(t *testing.T) {
	const self = "labkeep/guardian/guard"
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, self).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", self, err, out)
	}
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		imports[f[0]] = f[1:]
	}
	if _, ok := imports[self]; !ok {
		t.Fatalf("go list printed no line for %s:\n%s", self, out)
	}
	isHTTP := func(p string) bool { return p == "net/http" || strings.HasPrefix(p, "net/http/") }
	mayUseHTTP := map[string]bool{"labkeep/guardian/alert": true}
	for pkg, deps := range imports {
		if pkg == "labkeep/guardian/httpapi" {
			t.Errorf("%s depends on labkeep/guardian/httpapi; the adapter must depend on the loops, not the reverse", self)
		}
		if !strings.HasPrefix(pkg, "labkeep/") || mayUseHTTP[pkg] {
			continue
		}
		for _, d := range deps {
			if isHTTP(d) {
				t.Errorf("%s (a dependency of %s, or itself) imports %s", pkg, self, d)
			}
		}
	}
}
