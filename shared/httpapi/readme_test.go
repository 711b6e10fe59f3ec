package httpapi_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// README.md, the API reference, names exactly the operations openapi.yaml
// describes: each "METHOD /path" of the spec is the first cell of a row of
// its endpoint table, and each row names an operation of the spec.
func TestReadmeNamesEveryOperation(t *testing.T) {
	spec, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if err := yaml.Unmarshal(spec, &doc); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	var want []string
	for p, ops := range doc.Paths {
		for method := range ops {
			switch method {
			case "get", "put", "post", "delete", "patch", "head", "options":
				want = append(want, strings.ToUpper(method)+" "+p)
			}
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([A-Z]+ /[^`\\s]*)`")
	var got []string
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		if !slices.Contains(got, m[1]) { // openSession has a row per form
			got = append(got, m[1])
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if len(want) < 10 {
		t.Fatalf("openapi.yaml has only %v", want)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("operations: openapi.yaml (-) vs README.md's endpoint table (+):\n%s", diff)
	}
}
