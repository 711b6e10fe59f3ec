package benchtable

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Ratio is Value / BaselineValue; ok is false when there is no baseline or
// it is 0 (no ratio to give).
func (r Row) Ratio() (ratio float64, ok bool) {
	if r.BaselineValue == nil || *r.BaselineValue == 0 {
		return 0, false
	}
	return r.Value / *r.BaselineValue, true
}

// RatioText is the ratio as the table prints it: "0.12×", or why there is
// none.
func (r Row) RatioText() string {
	switch ratio, ok := r.Ratio(); {
	case ok:
		return Number(ratio) + "×"
	case r.BaselineValue == nil:
		return "—"
	case r.Value == 0:
		return "— (both 0)"
	default:
		return "— (baseline 0)"
	}
}

func (r Row) baselineText() string {
	if r.BaselineValue == nil {
		return "— (" + r.Why + ")"
	}
	return withUnit(*r.BaselineValue, r.Unit)
}

func withUnit(v float64, unit string) string {
	if unit == "count" || unit == "" {
		return Number(v)
	}
	return Number(v) + " " + unit
}

// Number formats v with the precision a table reader wants: integers as
// integers, otherwise three significant figures (at least one decimal below
// 100).
func Number(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return strconv.FormatFloat(v, 'g', -1, 64)
	case v == math.Trunc(v) && a < 1e15:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// ReadRows reads the JSON lines Record wrote. A line that is not a valid row
// is an error naming its line number: a table with a silently missing row
// would look complete.
func ReadRows(r io.Reader) ([]Row, error) {
	var rows []Row
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var row Row
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&row); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if err := row.Validate(); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		rows = append(rows, row)
	}
	return rows, sc.Err()
}

// ReadRowsFile is ReadRows of the file at path.
func ReadRowsFile(path string) ([]Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := ReadRows(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rows, nil
}

// Sort orders rows by group (benchmark packages run in any order), keeping
// the order each benchmark recorded its rows in within a group.
func Sort(rows []Row) {
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Group < rows[j].Group })
}

// WriteMarkdown prints the table: one line per figure with its value, its
// baseline's value from the same run and their ratio, or why the baseline
// could not run.
func WriteMarkdown(w io.Writer, rows []Row) error {
	var b strings.Builder
	b.WriteString("| group | case | figure | value | baseline | baseline value | ratio | note |\n")
	b.WriteString("| --- | --- | --- | ---: | --- | ---: | ---: | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n",
			cell(r.Group), cell(r.Case), cell(r.Figure), cell(withUnit(r.Value, r.Unit)),
			cell(r.Baseline), cell(r.baselineText()), cell(r.RatioText()), cell(r.Note))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell keeps a value inside its markdown cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
