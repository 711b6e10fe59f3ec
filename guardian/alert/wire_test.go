package alert

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"
)

// labkeepDescription is where the wire format of a delivered alert is
// described once: the GuardianAlert schema of labkeep's POST
// /guardianAlert. guardian shares no Go package with labkeep; it reads the
// description itself, so an alert guardian would send and labkeep would
// not read fails here.
var labkeepDescription = filepath.Join("..", "..", "shared", "httpapi", "openapi.yaml")

// guardianAlertSchema returns the GuardianAlert schema of labkeep's
// description.
func guardianAlertSchema(t *testing.T) *openapi3.Schema {
	t.Helper()
	raw, err := os.ReadFile(labkeepDescription)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatalf("labkeep's description does not load: %v", err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("labkeep's description is not valid: %v", err)
	}
	ref := doc.Components.Schemas["GuardianAlert"]
	if ref == nil || ref.Value == nil {
		t.Fatal("labkeep's description has no GuardianAlert schema")
	}
	return ref.Value
}

// asJSONValue is v marshalled and read back as plain JSON values.
func asJSONValue(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// The described example, built as guardian builds alerts, marshals to
// exactly the example: the same names, no field left out or added.
func TestAlertMarshalsAsTheDescribedExample(t *testing.T) {
	s := guardianAlertSchema(t)
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	al := Alert{Kind: "memory-kill", Subject: "4242", Severity: Critical, Message: "killed python3 (PID 4242, 3.9 GiB)",
		Fields: map[string]string{"pid": "4242", "comm": "python3"}, Workspace: "ws-1", First: t0, Last: t0.Add(3 * time.Second), Count: 2}
	if diff := cmp.Diff(asJSONValue(t, s.Example), asJSONValue(t, al)); diff != "" {
		t.Errorf("guardian's alert against the described example (-want +got):\n%s", diff)
	}
}

// Every severity guardian raises is one the description allows.
func TestSeveritiesAreDescribed(t *testing.T) {
	sev := guardianAlertSchema(t).Properties["severity"].Value
	var allowed []string
	for _, v := range sev.Enum {
		allowed = append(allowed, v.(string))
	}
	for _, s := range []Severity{Info, Warning, Critical} {
		if !slices.Contains(allowed, string(s)) {
			t.Errorf("severity %q is not among the described %v", s, allowed)
		}
	}
}

// recorder keeps the raw bodies a webhook receives.
type recorder struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.bodies = append(rec.bodies, b)
}

func (rec *recorder) received() [][]byte {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.bodies)
}

// What the aggregator really delivers validates against the described
// schema, for each shape an alert can take.
func TestDeliveredAlertsAreTheDescribedWireFormat(t *testing.T) {
	s := guardianAlertSchema(t)
	tests := []struct {
		name  string
		raise func(a *Aggregator)
	}{
		{"an alert without fields", func(a *Aggregator) { a.Raise("sshd-gone", "", Critical, "sshd is gone", nil) }},
		{"an alert with fields", func(a *Aggregator) {
			a.Raise("memory-kill", "4242", Warning, "killed python3", map[string]string{"pid": "4242", "comm": "python3"})
		}},
		{"an alert with its fields truncated", func(a *Aggregator) {
			a.Raise("kill", "s", Info, "m", map[string]string{"a": "1", "b": "2", "c": "3"})
		}},
		{"user text bounded", func(a *Aggregator) { a.Raise("kill", "evil\n\x1b[2J", Info, "\xff", nil) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{}
			srv := httptest.NewServer(rec)
			defer srv.Close()
			c := &clock{time.Unix(1000, 0)}
			a := New(Config{Workspace: "ws-1", WebhookURL: srv.URL, MaxFields: 2, Attempts: 1}, c.now, srv.Client(), nil)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go a.Run(ctx)
			tt.raise(a)
			waitStats(t, a, func(s Stats) bool { return s.Delivered+s.Failed == 1 })
			bodies := rec.received()
			if len(bodies) != 1 {
				t.Fatalf("webhook received %d bodies, want 1", len(bodies))
			}
			var v any
			if err := json.Unmarshal(bodies[0], &v); err != nil {
				t.Fatalf("delivered body is not JSON: %v: %s", err, bodies[0])
			}
			if err := s.VisitJSON(v); err != nil {
				t.Errorf("delivered body is not labkeep's GuardianAlert: %v\n%s", err, bodies[0])
			}
		})
	}
}
