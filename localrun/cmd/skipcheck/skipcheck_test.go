package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const tableHead = "| package | test | why it skips here |\n| --- | --- | --- |\n"

func TestParseTable(t *testing.T) {
	cases := map[string]struct {
		doc     string
		want    map[testID]string
		wantErr string
	}{
		"rows name their test exactly, code spans and escaped pipes read as their text": {
			doc: "# Skips\n\nSome prose.\n\n" + tableHead +
				"| `labkeep/a` | `TestX/sub_one` | needs `x` \\| y |\n" +
				"| labkeep/b | TestY | no z here |\n\nMore prose.\n",
			want: map[testID]string{
				{"labkeep/a", "TestX/sub_one"}: "needs `x` | y",
				{"labkeep/b", "TestY"}:         "no z here",
			},
		},
		"a table without rows allows no skip": {
			doc:  tableHead,
			want: map[testID]string{},
		},
		"no table": {
			doc:     "# Skips\n\nnone\n",
			wantErr: "no table: want one with the header | package | test | why it skips here |",
		},
		"another header": {
			doc:     "| package | test | why |\n| --- | --- | --- |\n",
			wantErr: `line 1: the table's header is ["package" "test" "why"]; want ["package" "test" "why it skips here"]`,
		},
		"no delimiter row": {
			doc:     "| package | test | why it skips here |\n| a | b | c |\n",
			wantErr: "line 2: want the delimiter row (| --- | --- | --- |) under the header",
		},
		"a row with another number of cells": {
			doc:     tableHead + "| labkeep/a | TestX |\n",
			wantErr: "line 3: 2 cells; want 3 (package, test, why it skips here)",
		},
		"an empty reason": {
			doc:     tableHead + "| labkeep/a | TestX |  |\n",
			wantErr: `line 3: the "why it skips here" cell is empty`,
		},
		"an empty code span": {
			doc:     tableHead + "| labkeep/a | `` | why |\n",
			wantErr: `line 3: the "test" cell is empty`,
		},
		"a test listed twice": {
			doc:     tableHead + "| labkeep/a | TestX | one |\n| `labkeep/a` | `TestX` | two |\n",
			wantErr: "line 4: labkeep/a TestX is listed twice",
		},
		"a second table": {
			doc:     tableHead + "| labkeep/a | TestX | one |\n\n" + tableHead,
			wantErr: "line 5: a second table; the skips are listed in one",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := parseTable(tc.doc)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("parseTable() = %v; want the error %q", got, tc.wantErr)
				}
				if diff := cmp.Diff(tc.wantErr, err.Error()); diff != "" {
					t.Errorf("parseTable() error (-want +got):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("parseTable() (-want +got):\n%s", diff)
			}
		})
	}
}

// The project's own table is one `make test` can read.
func TestProjectTableParses(t *testing.T) {
	allowed, err := readTable("../../../test/skips.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(allowed) == 0 {
		t.Error("test/skips.md lists no skip; the helper processes at least skip in every run")
	}
}

// stream is a go test -json stream: each event marshalled on a line of its
// own, each string as a raw line.
func stream(t *testing.T, items ...any) string {
	t.Helper()
	var b strings.Builder
	for _, it := range items {
		switch it := it.(type) {
		case event:
			j, err := json.Marshal(it)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(j)
			b.WriteByte('\n')
		case string:
			b.WriteString(it + "\n")
		default:
			t.Fatalf("stream item %T: want an event or a raw line", it)
		}
	}
	return b.String()
}

func out(pkg, test, output string) event {
	return event{Action: "output", Package: pkg, Test: test, Output: output}
}

func act(action, pkg, test string) event { return event{Action: action, Package: pkg, Test: test} }

func TestCheck(t *testing.T) {
	allowed := map[testID]string{
		{"labkeep/a", "TestHelper"}:    "not a test",
		{"labkeep/a", "TestListed"}:    "no engine here",
		{"labkeep/elsewhere", "TestZ"}: "not in this stream",
	}
	cases := map[string]struct {
		in         []any
		wantOutput string
		want       report
	}{
		"a passing package shows only the go command's summary line": {
			in: []any{
				act("start", "labkeep/a", ""),
				out("labkeep/a", "", "from TestMain\n"),
				act("run", "labkeep/a", "TestOK"),
				out("labkeep/a", "TestOK", "=== RUN   TestOK\n"),
				out("labkeep/a", "TestOK", "    a_test.go:3: a log line\n"),
				out("labkeep/a", "TestOK", "--- PASS: TestOK (0.00s)\n"),
				act("pass", "labkeep/a", "TestOK"),
				out("labkeep/a", "", "PASS\n"),
				out("labkeep/a", "", "ok  \tlabkeep/a\t0.1s\n"),
				act("pass", "labkeep/a", ""),
			},
			wantOutput: "ok  \tlabkeep/a\t0.1s\n",
			want:       report{Packages: 1, Unskipped: []unskipped{{testID{"labkeep/a", "TestHelper"}, "did not run"}, {testID{"labkeep/a", "TestListed"}, "did not run"}}},
		},
		"a failed test shows its output without the verbose framing, on its own failure as a subtest too": {
			in: []any{
				act("start", "labkeep/b", ""),
				act("run", "labkeep/b", "TestP"),
				out("labkeep/b", "TestP", "=== RUN   TestP\n"),
				act("run", "labkeep/b", "TestP/ok"),
				out("labkeep/b", "TestP/ok", "=== RUN   TestP/ok\n"),
				out("labkeep/b", "TestP/ok", "--- PASS: TestP/ok (0.00s)\n"),
				act("pass", "labkeep/b", "TestP/ok"),
				act("run", "labkeep/b", "TestP/bad"),
				out("labkeep/b", "TestP/bad", "=== RUN   TestP/bad\n"),
				out("labkeep/b", "TestP/bad", "=== PAUSE TestP/bad\n"),
				act("pause", "labkeep/b", "TestP/bad"),
				out("labkeep/b", "TestP/bad", "=== CONT  TestP/bad\n"),
				act("cont", "labkeep/b", "TestP/bad"),
				out("labkeep/b", "TestP/bad", "    b_test.go:8: boom\n"),
				out("labkeep/b", "TestP/bad", "--- FAIL: TestP/bad (0.00s)\n"),
				act("fail", "labkeep/b", "TestP/bad"),
				out("labkeep/b", "TestP", "--- FAIL: TestP (0.00s)\n"),
				act("fail", "labkeep/b", "TestP"),
				out("labkeep/b", "", "FAIL\n"),
				out("labkeep/b", "", "FAIL\tlabkeep/b\t0.1s\n"),
				act("fail", "labkeep/b", ""),
			},
			wantOutput: "    b_test.go:8: boom\n--- FAIL: TestP/bad (0.00s)\n--- FAIL: TestP (0.00s)\nFAIL\nFAIL\tlabkeep/b\t0.1s\n",
			want:       report{Packages: 1, Failed: true},
		},
		"a crashed package shows the output of its tests that never ended, then its own": {
			in: []any{
				act("start", "labkeep/c", ""),
				out("labkeep/c", "", "from TestMain\n"),
				act("run", "labkeep/c", "TestFirst"),
				out("labkeep/c", "TestFirst", "    c_test.go:3: waiting\n"),
				act("run", "labkeep/c", "TestSecond"),
				out("labkeep/c", "TestSecond", "panic: bye\n"),
				out("labkeep/c", "", "FAIL\tlabkeep/c\t0.1s\n"),
				act("fail", "labkeep/c", ""),
			},
			wantOutput: "    c_test.go:3: waiting\npanic: bye\nfrom TestMain\nFAIL\tlabkeep/c\t0.1s\n",
			want:       report{Packages: 1, Failed: true},
		},
		"a listed skip carries the table's reason, an unlisted one its last lines": {
			in: []any{
				act("start", "labkeep/a", ""),
				act("run", "labkeep/a", "TestHelper"),
				out("labkeep/a", "TestHelper", "=== RUN   TestHelper\n"),
				out("labkeep/a", "TestHelper", "    a_test.go:9: helper process only\n"),
				out("labkeep/a", "TestHelper", "--- SKIP: TestHelper (0.00s)\n"),
				act("skip", "labkeep/a", "TestHelper"),
				act("run", "labkeep/a", "TestListed"),
				act("pass", "labkeep/a", "TestListed"),
				act("run", "labkeep/a", "TestNew/sub"),
				out("labkeep/a", "TestNew/sub", "=== RUN   TestNew/sub\n"),
				out("labkeep/a", "TestNew/sub", "    a_test.go:20: l1\n"),
				out("labkeep/a", "TestNew/sub", "    a_test.go:21: l2\n"),
				out("labkeep/a", "TestNew/sub", "    a_test.go:22: l3\n"),
				out("labkeep/a", "TestNew/sub", "    a_test.go:23: l4\n"),
				out("labkeep/a", "TestNew/sub", "    a_test.go:24: l5\n"),
				out("labkeep/a", "TestNew/sub", "    a_test.go:25: needs x\n"),
				out("labkeep/a", "TestNew/sub", "--- SKIP: TestNew/sub (0.00s)\n"),
				act("skip", "labkeep/a", "TestNew/sub"),
				out("labkeep/a", "", "ok  \tlabkeep/a\t0.1s\n"),
				act("pass", "labkeep/a", ""),
			},
			wantOutput: "ok  \tlabkeep/a\t0.1s\n",
			want: report{
				Packages: 1,
				Skips: []skip{
					{testID{"labkeep/a", "TestHelper"}, []string{"    a_test.go:9: helper process only"}, "not a test"},
					{testID{"labkeep/a", "TestNew/sub"}, []string{
						"    a_test.go:21: l2", "    a_test.go:22: l3", "    a_test.go:23: l4", "    a_test.go:24: l5", "    a_test.go:25: needs x"}, ""},
				},
				Unskipped: []unskipped{{testID{"labkeep/a", "TestListed"}, "passed"}},
			},
		},
		"a package without test files is no test skip": {
			in: []any{
				act("start", "labkeep/d", ""),
				out("labkeep/d", "", "?   \tlabkeep/d\t[no test files]\n"),
				act("skip", "labkeep/d", ""),
			},
			wantOutput: "?   \tlabkeep/d\t[no test files]\n",
			want:       report{Packages: 1},
		},
		"build output is printed as it comes and a build failure fails": {
			in: []any{
				event{Action: "build-output", ImportPath: "labkeep/e [labkeep/e.test]", Output: "# labkeep/e [labkeep/e.test]\n"},
				event{Action: "build-output", ImportPath: "labkeep/e [labkeep/e.test]", Output: "e_test.go:3:27: undefined: x\n"},
				event{Action: "build-fail", ImportPath: "labkeep/e [labkeep/e.test]"},
				act("start", "labkeep/e", ""),
				out("labkeep/e", "", "FAIL\tlabkeep/e [build failed]\n"),
				act("fail", "labkeep/e", ""),
			},
			wantOutput: "# labkeep/e [labkeep/e.test]\ne_test.go:3:27: undefined: x\nFAIL\tlabkeep/e [build failed]\n",
			want:       report{Packages: 1, Failed: true},
		},
		"a line that is no event is printed as it is and fails nothing": {
			in: []any{
				"go: downloading example.com/m v1.0.0",
				`{"not": "an event"}`,
				act("start", "labkeep/d", ""),
				out("labkeep/d", "", "ok  \tlabkeep/d\t0.1s\n"),
				act("pass", "labkeep/d", ""),
			},
			wantOutput: "go: downloading example.com/m v1.0.0\n{\"not\": \"an event\"}\nok  \tlabkeep/d\t0.1s\n",
			want:       report{Packages: 1},
		},
		"a package that never reports its result is unfinished, and shows what it printed": {
			in: []any{
				act("start", "labkeep/d", ""),
				act("run", "labkeep/d", "TestHang"),
				out("labkeep/d", "TestHang", "    d_test.go:5: still here\n"),
			},
			wantOutput: "    d_test.go:5: still here\n",
			want:       report{Packages: 1, Unfinished: []string{"labkeep/d"}},
		},
		"an empty stream has no package": {
			in:         []any{"go: no such package"},
			want:       report{},
			wantOutput: "go: no such package\n",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got strings.Builder
			w := bufio.NewWriter(&got)
			r, err := check(strings.NewReader(stream(t, tc.in...)), w, allowed)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantOutput, got.String()); diff != "" {
				t.Errorf("printed (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, r, cmp.AllowUnexported(skip{}, unskipped{})); diff != "" {
				t.Errorf("report (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	listed := skip{testID{"labkeep/a", "TestX"}, nil, "why"}
	unlisted := skip{testID{"labkeep/a", "TestY"}, []string{"needs y"}, ""}
	cases := map[string]struct {
		r    report
		want int
	}{
		"every skip listed and nothing failed":          {report{Packages: 1, Skips: []skip{listed}}, 0},
		"a listed test that did not skip fails nothing": {report{Packages: 1, Unskipped: []unskipped{{testID{"labkeep/a", "TestZ"}, "passed"}}}, 0},
		"a skip not listed":                             {report{Packages: 1, Skips: []skip{listed, unlisted}}, 1},
		"a failure":                                     {report{Packages: 1, Failed: true}, 1},
		"a package without a result":                    {report{Packages: 1, Unfinished: []string{"labkeep/a"}}, 1},
		"no package at all":                             {report{}, 1},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := tc.r.exitCode(); got != tc.want {
				t.Errorf("exitCode() = %d; want %d", got, tc.want)
			}
		})
	}
}

func TestSummary(t *testing.T) {
	cases := map[string]struct {
		r    report
		want string
	}{
		"no skip": {
			r:    report{Packages: 2},
			want: "\nskipcheck: tests skipped: 0, not listed in test/skips.md: 0\n",
		},
		"a listed skip shows its reason, an unlisted one its lines and the row to add, drafted from its last line": {
			r: report{Packages: 1, Skips: []skip{
				{testID{"labkeep/a", "TestX"}, []string{"    a_test.go:9: helper"}, "not a test"},
				{testID{"labkeep/a", "TestY/sub"}, []string{"    a_test.go:3: trying", "    a_test.go:4: needs y | z", "        on this | machine"}, ""},
			}},
			want: "\nskipcheck: tests skipped: 2, not listed in test/skips.md: 1\n" +
				"  listed      labkeep/a TestX: not a test\n" +
				"  NOT LISTED  labkeep/a TestY/sub, which printed:\n" +
				"                    a_test.go:3: trying\n" +
				"                    a_test.go:4: needs y | z\n" +
				"                        on this | machine\n" +
				"              its row, if CI may skip it: | `labkeep/a` | `TestY/sub` | on this \\| machine |\n",
		},
		"stale rows, unfinished packages and failures are said": {
			r: report{Packages: 1, Failed: true, Unfinished: []string{"labkeep/b"},
				Unskipped: []unskipped{{testID{"labkeep/a", "TestZ"}, "passed"}}},
			want: "\nskipcheck: tests skipped: 0, not listed in test/skips.md: 0\n" +
				"skipcheck: listed in test/skips.md but did not skip here (a row for a test CI runs goes):\n" +
				"  labkeep/a TestZ: passed\n" +
				"skipcheck: labkeep/b never reported its result (the stream ended early)\n" +
				"skipcheck: tests failed (above)\n",
		},
		"an empty stream": {
			r: report{},
			want: "\nskipcheck: tests skipped: 0, not listed in test/skips.md: 0\n" +
				"skipcheck: no package in the stream: did go test -json run?\n",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got strings.Builder
			tc.r.write(&got, "test/skips.md")
			if diff := cmp.Diff(tc.want, got.String()); diff != "" {
				t.Errorf("summary (-want +got):\n%s", diff)
			}
		})
	}
}
