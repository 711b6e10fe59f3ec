package alerts

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"
)

// description loads labkeep's OpenAPI document, where the alert guardian
// posts (GuardianAlert) and the alert labkeep keeps (Alert) are described
// once. guardian's sender tests itself against the same schemas.
func description(t *testing.T) *openapi3.T {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "httpapi", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatalf("openapi.yaml does not load: %v", err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("openapi.yaml is not valid: %v", err)
	}
	return doc
}

func schema(t *testing.T, doc *openapi3.T, name string) *openapi3.Schema {
	t.Helper()
	ref := doc.Components.Schemas[name]
	if ref == nil || ref.Value == nil {
		t.Fatalf("openapi.yaml has no schema %s", name)
	}
	return ref.Value
}

// jsonNames are the JSON names of t's fields, those of embedded structs
// included, in order.
func jsonNames(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		if f.Anonymous {
			names = append(names, jsonNames(f.Type)...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		names = append(names, name)
	}
	return names
}

// The receiver reads the described example as guardian sends it, strictly
// (unknown fields refused, as POST /guardianAlert does), accepts it under
// the default limits, and writes it back byte for byte the same JSON.
func TestPostedReadsTheDescribedExample(t *testing.T) {
	example, err := json.Marshal(schema(t, description(t), "GuardianAlert").Example)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(example))
	dec.DisallowUnknownFields()
	var got Posted
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("decoding the described example: %v", err)
	}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	want := Posted{Kind: "memory-kill", Subject: "4242", Severity: Critical, Message: "killed python3 (PID 4242, 3.9 GiB)",
		Fields: map[string]string{"pid": "4242", "comm": "python3"}, Workspace: "ws-1", First: t0, Last: t0.Add(3 * time.Second), Count: 2}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decoded example (-want +got):\n%s", diff)
	}
	if err := DefaultLimits().Check(Alert{Posted: got}); err != nil {
		t.Errorf("the described example is refused: %v", err)
	}
	var back, orig any
	b, _ := json.Marshal(got)
	_ = json.Unmarshal(b, &back)
	_ = json.Unmarshal(example, &orig)
	if diff := cmp.Diff(orig, back); diff != "" {
		t.Errorf("the example written back (-want +got):\n%s", diff)
	}
}

// Each type's JSON names are exactly its schema's properties, and the
// severities Check accepts are exactly the described ones.
func TestTypesAreTheDescribedSchemas(t *testing.T) {
	doc := description(t)
	tests := []struct {
		name, schema string
		typ          reflect.Type
	}{
		{"what guardian posts", "GuardianAlert", reflect.TypeFor[Posted]()},
		{"what labkeep keeps and shows", "Alert", reflect.TypeFor[Alert]()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var described []string
			for p := range schema(t, doc, tt.schema).Properties {
				described = append(described, p)
			}
			if diff := cmp.Diff(slices.Sorted(slices.Values(described)), slices.Sorted(slices.Values(jsonNames(tt.typ)))); diff != "" {
				t.Errorf("%s properties against %s's JSON names (-want +got):\n%s", tt.schema, tt.typ, diff)
			}
		})
	}
	t.Run("severities", func(t *testing.T) {
		var described []string
		for _, v := range schema(t, doc, "Severity").Enum {
			described = append(described, v.(string))
		}
		var accepted []string
		for _, s := range []Severity{Info, Warning, Critical, "fatal", ""} {
			a := Alert{Posted: Posted{Kind: "k", Severity: s, First: time.Unix(1, 0), Last: time.Unix(1, 0), Count: 1}}
			if DefaultLimits().Check(a) == nil {
				accepted = append(accepted, string(s))
			}
		}
		if diff := cmp.Diff(slices.Sorted(slices.Values(described)), slices.Sorted(slices.Values(accepted))); diff != "" {
			t.Errorf("described severities against accepted (-want +got):\n%s", diff)
		}
	})
}
