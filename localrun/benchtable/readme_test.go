package benchtable

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestReplaceTable(t *testing.T) {
	res := NewResult(time.Date(2026, 12, 1, 15, 4, 39, 0, time.UTC), false,
		Machine{Cores: 2, CPU: "cpu", MemoryMiB: 1024, Kernel: "6.1", Cgroup: "v2", Go: "go1.26"},
		[]Row{{Group: "g", Case: "c", Figure: "f", Value: 2, Unit: "s", Baseline: "b", BaselineValue: F(4)}})
	table := "\n**2026-12-01T15:04:39Z; 2 cores (cpu), 1024 MiB, kernel 6.1, cgroup v2, go1.26** (`r.json`)\n\n" +
		"| group | case | figure | value | baseline | baseline value | ratio | note |\n" +
		"| --- | --- | --- | ---: | --- | ---: | ---: | --- |\n" +
		"| g | c | f | 2 s | b | 4 s | 0.5× |  |\n"
	tests := []struct {
		name, doc, want, err string
	}{
		{"fills the markers", "intro\n" + TableStart + "\n" + TableEnd + "\nend\n",
			"intro\n" + TableStart + table + TableEnd + "\nend\n", ""},
		{"replaces an older table", TableStart + "\nold | table\n" + TableEnd + "\n",
			TableStart + table + TableEnd + "\n", ""},
		{"no markers", "nothing here\n", "", "want exactly one"},
		{"markers swapped", TableEnd + "\n" + TableStart + "\n", "", "before"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReplaceTable([]byte(tt.doc), res, "r.json")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one saying %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("document (-want +got):\n%s", diff)
			}
		})
	}
}
