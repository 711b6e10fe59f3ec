package benchtable

import (
	"bytes"
	"errors"
	"strings"
)

// The markers around the table in test/bench/README.md.
const (
	TableStart = "<!-- bench table -->"
	TableEnd   = "<!-- /bench table -->"
)

// ReplaceTable returns doc with what lies between TableStart and TableEnd
// replaced by res: its heading (the date and the machine), the saved file's
// name, and the table. The markers must each appear once, in that order.
func ReplaceTable(doc []byte, res Result, savedAs string) ([]byte, error) {
	s := string(doc)
	if strings.Count(s, TableStart) != 1 || strings.Count(s, TableEnd) != 1 {
		return nil, errors.New("want exactly one " + TableStart + " and one " + TableEnd)
	}
	i, j := strings.Index(s, TableStart)+len(TableStart), strings.Index(s, TableEnd)
	if j < i {
		return nil, errors.New(TableEnd + " before " + TableStart)
	}
	var b bytes.Buffer
	b.WriteString("\n**" + res.Heading() + "** (`" + savedAs + "`)\n\n")
	if err := WriteMarkdown(&b, res.TableRows()); err != nil {
		return nil, err
	}
	return []byte(s[:i] + b.String() + s[j:]), nil
}
