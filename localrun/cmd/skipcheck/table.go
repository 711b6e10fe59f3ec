package main

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// testID names one test in the stream and in the table: the package's
// import path and the test's full name as go test reports it.
type testID struct {
	Package, Test string
}

func (id testID) String() string { return id.Package + " " + id.Test }

// header is the table's header row: its columns, in this order.
var header = []string{"package", "test", "why it skips here"}

// delimiterCell is a cell of the row under a Markdown table's header.
var delimiterCell = regexp.MustCompile(`^:?-+:?$`)

// parseTable returns the rows of doc's one Markdown table: for each listed
// test, why it skips. The package and test cells may be code spans
// (`...`): they name their text.
// No table, another header, a row with another number of cells or an empty
// cell, a duplicate row or a second table is an error naming the line.
func parseTable(doc string) (map[testID]string, error) {
	lines := strings.Split(doc, "\n")
	start := slices.IndexFunc(lines, isTableLine)
	if start < 0 {
		return nil, fmt.Errorf("no table: want one with the header | %s |", strings.Join(header, " | "))
	}
	if got := cells(lines[start]); !slices.Equal(got, header) {
		return nil, fmt.Errorf("line %d: the table's header is %q; want %q", start+1, got, header)
	}
	if start+1 >= len(lines) || !isDelimiterRow(lines[start+1]) {
		return nil, fmt.Errorf("line %d: want the delimiter row (| --- | --- | --- |) under the header", start+2)
	}
	allowed := map[testID]string{}
	end := start + 2
	for ; end < len(lines) && isTableLine(lines[end]); end++ {
		row := cells(lines[end])
		if len(row) != len(header) {
			return nil, fmt.Errorf("line %d: %d cells; want %d (%s)", end+1, len(row), len(header), strings.Join(header, ", "))
		}
		id, why := testID{Package: unquote(row[0]), Test: unquote(row[1])}, row[2]
		for i, cell := range []string{id.Package, id.Test, why} {
			if cell == "" {
				return nil, fmt.Errorf("line %d: the %q cell is empty", end+1, header[i])
			}
		}
		if _, dup := allowed[id]; dup {
			return nil, fmt.Errorf("line %d: %s is listed twice", end+1, id)
		}
		allowed[id] = why
	}
	if more := slices.IndexFunc(lines[end:], isTableLine); more >= 0 {
		return nil, fmt.Errorf("line %d: a second table; the skips are listed in one", end+more+1)
	}
	return allowed, nil
}

func isTableLine(line string) bool { return strings.HasPrefix(strings.TrimSpace(line), "|") }

func isDelimiterRow(line string) bool {
	row := cells(line)
	if len(row) != len(header) {
		return false
	}
	for _, c := range row {
		if !delimiterCell.MatchString(c) {
			return false
		}
	}
	return true
}

// cells splits a table line at its unescaped pipes and returns the cells
// trimmed, with "\|" read as "|".
func cells(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	if strings.HasSuffix(line, "|") && !strings.HasSuffix(line, `\|`) {
		line = line[:len(line)-1]
	}
	var out []string
	var cell strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cell.WriteByte('|')
			i++
		case line[i] == '|':
			out = append(out, strings.TrimSpace(cell.String()))
			cell.Reset()
		default:
			cell.WriteByte(line[i])
		}
	}
	return append(out, strings.TrimSpace(cell.String()))
}

// unquote drops the backticks of a cell written as a code span.
func unquote(cell string) string {
	if len(cell) >= 2 && strings.HasPrefix(cell, "`") && strings.HasSuffix(cell, "`") {
		return cell[1 : len(cell)-1]
	}
	return cell
}
