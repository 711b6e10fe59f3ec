package benchtable

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestValidateRefusesRowsTheTableCannotPlace(t *testing.T) {
	ok := Row{Group: "g", Case: "c", Figure: "f", Unit: "ms", Baseline: "b", BaselineValue: F(1)}
	for name, tc := range map[string]struct {
		edit func(*Row)
		want string // substring of the error; "" for valid
	}{
		"complete row with baseline":        {edit: func(*Row) {}},
		"no baseline but says why":          {edit: func(r *Row) { r.BaselineValue, r.Why = nil, "needs KVM" }},
		"no baseline and no why":            {edit: func(r *Row) { r.BaselineValue = nil }, want: "no BaselineValue and no Why"},
		"why beside a baseline that ran":    {edit: func(r *Row) { r.Why = "x" }, want: "Why is set"},
		"no figure":                         {edit: func(r *Row) { r.Figure = "" }, want: "Figure is empty"},
		"no unit":                           {edit: func(r *Row) { r.Unit = "" }, want: "Unit is empty"},
		"baseline value without its naming": {edit: func(r *Row) { r.Baseline = "" }, want: "Baseline is empty"},
	} {
		t.Run(name, func(t *testing.T) {
			r := ok
			tc.edit(&r)
			err := r.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestRatioTextSaysWhyThereIsNone(t *testing.T) {
	for name, tc := range map[string]struct {
		value    float64
		baseline *float64
		want     string
	}{
		"ratio of the two":         {value: 5, baseline: F(20), want: "0.25×"},
		"above the baseline":       {value: 30, baseline: F(20), want: "1.50×"},
		"no baseline":              {value: 5, want: "—"},
		"both zero":                {value: 0, baseline: F(0), want: "— (both 0)"},
		"baseline zero, value not": {value: 3, baseline: F(0), want: "— (baseline 0)"},
	} {
		t.Run(name, func(t *testing.T) {
			r := Row{Value: tc.value, BaselineValue: tc.baseline}
			if got := r.RatioText(); got != tc.want {
				t.Fatalf("RatioText() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNumberKeepsThreeSignificantFigures(t *testing.T) {
	for in, want := range map[float64]string{
		10000: "10000", 0: "0", 123.456: "123", 12.345: "12.3", 1.23456: "1.23", 0.0123456: "0.0123", -2.5: "-2.50",
	} {
		if got := Number(in); got != want {
			t.Errorf("Number(%v) = %q, want %q", in, got, want)
		}
	}
}

// Rows recorded by separate Record calls come back in order from the file
// the command reads, and the table prints each with its ratio or its why.
func TestRecordedRowsReadBackAndPrint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rows.jsonl")
	t.Setenv(RowsEnv, path)
	rows := []Row{
		{Group: "Open burst", Case: "10 students", Figure: "overshoot", Value: 0, Unit: "count", Baseline: "check-then-create", BaselineValue: F(2)},
		{Group: "Open burst", Case: "10 students", Figure: "p99", Value: 12.5, Unit: "ms", Baseline: "cloud", Why: "needs a cloud | account"},
	}
	for _, r := range rows {
		Record(t, r)
	}
	got, err := ReadRowsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(rows, got); diff != "" {
		t.Fatalf("rows read back (-want +got):\n%s", diff)
	}
	var b bytes.Buffer
	if err := WriteMarkdown(&b, got); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| Open burst | 10 students | overshoot | 0 | check-then-create | 2 | 0× |",
		"| 12.5 ms | cloud | — (needs a cloud \\| account) | — |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestReadRowsNamesTheBadLine(t *testing.T) {
	in := `{"group":"g","case":"c","figure":"f","value":1,"unit":"ms","baseline":"b","baselineValue":2}
{"group":"g","case":"c","figure":"f","value":1,"unit":"ms","baseline":"b","baselineValue":null}
`
	_, err := ReadRows(strings.NewReader(in))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("ReadRows() = %v, want an error naming line 2", err)
	}
}

func TestThisMachineReadsKernelMemoryAndCgroup(t *testing.T) {
	m, err := ThisMachine("go-test")
	if err != nil {
		t.Fatal(err)
	}
	if m.Cores < 1 || m.MemoryMiB < 1 || m.Kernel == "" || m.Go != "go-test" {
		t.Fatalf("ThisMachine() = %+v", m)
	}
	if m.Cgroup != "v1" && m.Cgroup != "v2" && m.Cgroup != "hybrid" {
		t.Fatalf("cgroup version %q, want v1, v2 or hybrid", m.Cgroup)
	}
}

func TestQuantile(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		q    float64
		want time.Duration
	}{
		{"none", nil, 0.5, 0},
		{"the median of an odd count", ds, 0.5, 3},
		{"the lowest", ds, 0, 1},
		{"the highest", ds, 1, 5},
		{"p99 of five: the nearest rank below", ds, 0.99, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Quantile(tc.in, tc.q); got != tc.want {
				t.Errorf("Quantile(%v, %v) = %v, want %v", tc.in, tc.q, got, tc.want)
			}
		})
	}
	if diff := cmp.Diff([]time.Duration{5, 1, 4, 2, 3}, ds); diff != "" {
		t.Errorf("Quantile changed its input (-want +got):\n%s", diff)
	}
}
