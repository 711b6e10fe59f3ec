// Package benchtable is how the benchmarks of `make bench` report their
// figures: each figure is one Row carrying the baseline measured in the same
// run (or why none could run here), appended as one JSON line to the file
// named by $LABKEEP_BENCH_ROWS. The command localrun/cmd/benchtable reads
// that file after `go test -bench` and prints the one table with every
// figure, its baseline and their ratio, and saves it with the machine it ran
// on. A row file rather than parsing `go test` output keeps the figures
// typed and lets several benchmark packages (separate processes) append to
// the same table.
//
// Only benchmarks named BenchmarkTable… run under `make bench` and
// `make bench-quick`; under `make bench-quick` (Quick) each case runs once
// at its smallest scale so CI checks the benchmarks still run, never a
// number.
package benchtable

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
)

// RowsEnv names the file Record appends to; QuickEnv set to 1 selects the
// small scale.
const (
	RowsEnv  = "LABKEEP_BENCH_ROWS"
	QuickEnv = "LABKEEP_BENCH_QUICK"
)

// Row is one figure of the table with its baseline from the same run.
type Row struct {
	Group  string  `json:"group"`  // e.g. "Open burst"
	Case   string  `json:"case"`   // e.g. "200 students, capacity 8"
	Figure string  `json:"figure"` // e.g. "openSession p99"
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"` // "ms", "s", "count", "%", "MiB", "req", ...
	// Baseline says what the baseline is, e.g. "check-then-create without
	// the lock".
	Baseline string `json:"baseline"`
	// BaselineValue is the baseline's figure in the same unit, measured in
	// the same run; nil when the baseline cannot run here.
	BaselineValue *float64 `json:"baselineValue"`
	// Why says, when BaselineValue is nil, why the baseline cannot run here.
	Why  string `json:"why,omitempty"`
	Note string `json:"note,omitempty"`
}

// F returns a pointer to v, for Row.BaselineValue.
func F(v float64) *float64 { return &v }

// Validate says what is wrong with r: a row without a group, case, figure or
// unit can't be placed in the table, and a row without a baseline must say
// what the baseline would be and why it cannot run.
func (r Row) Validate() error {
	var errs []error
	for _, f := range []struct{ name, v string }{{"Group", r.Group}, {"Case", r.Case}, {"Figure", r.Figure}, {"Unit", r.Unit}, {"Baseline", r.Baseline}} {
		if f.v == "" {
			errs = append(errs, fmt.Errorf("%s is empty", f.name))
		}
	}
	if r.BaselineValue == nil && r.Why == "" {
		errs = append(errs, errors.New("no BaselineValue and no Why"))
	}
	if r.BaselineValue != nil && r.Why != "" {
		errs = append(errs, errors.New("Why is set but the baseline ran"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("row %q / %q / %q: %w", r.Group, r.Case, r.Figure, err)
	}
	return nil
}

// Record appends r as one JSON line to the file named by $LABKEEP_BENCH_ROWS
// (created if missing; one write to an O_APPEND file, so benchmark packages
// running as separate processes never interleave lines) and always logs it
// through tb. Without $LABKEEP_BENCH_ROWS (a plain `go test -bench`) it only
// logs. An invalid row or a failed write fails tb.
func Record(tb testing.TB, r Row) {
	tb.Helper()
	if err := r.Validate(); err != nil {
		tb.Fatal(err)
	}
	tb.Log(r.String())
	path := os.Getenv(RowsEnv)
	if path == "" {
		return
	}
	line, err := json.Marshal(r)
	if err != nil {
		tb.Fatal(err)
	}
	if err := appendLine(path, append(line, '\n')); err != nil {
		tb.Fatalf("benchtable: %v", err)
	}
}

func appendLine(path string, line []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Quick reports whether LABKEEP_BENCH_QUICK=1: run each case once at small
// scale.
func Quick() bool { return os.Getenv(QuickEnv) == "1" }

// String is the row on one line, as Record logs it.
func (r Row) String() string {
	s := fmt.Sprintf("%s | %s | %s = %s; baseline (%s) = %s; ratio %s",
		r.Group, r.Case, r.Figure, withUnit(r.Value, r.Unit), r.Baseline, r.baselineText(), r.RatioText())
	if r.Note != "" {
		s += "; " + r.Note
	}
	return s
}

// Quantile is the q-quantile (0 ≤ q ≤ 1) of ds by the nearest rank below,
// 0 for none; ds is left as it was. Every table row's p50 and p99 are
// this one rule.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}
