package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// event is the part of a test2json event (go test -json) or of a build
// event (go test -json's build output) that skipcheck reads.
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

// skipMessageLines is how many of a skipped test's last output lines are
// its skip message: t.Skip's own line, and what the test logged just
// before, which is often why.
const skipMessageLines = 5

// skip is a test that skipped.
type skip struct {
	testID
	Message []string // its last output lines, without the verbose framing
	Reason  string   // the table's reason; "" when the table does not list it
}

// unskipped is a listed test of a package in the stream that did not skip.
type unskipped struct {
	testID
	Result string // "passed", "failed" or "did not run"
}

// report is what a stream held, as far as skipcheck judges it.
type report struct {
	Skips      []skip
	Unskipped  []unskipped
	Unfinished []string // packages that started and never reported a result
	Packages   int      // packages in the stream
	Failed     bool     // a test, package or build failed
}

// checker follows one event stream: it prints what plain go test would
// print and keeps what the report needs. Only the output of tests and
// packages still running is held.
type checker struct {
	out      io.Writer
	allowed  map[testID]string
	tests    map[testID]*runningTest
	packages map[string]*packageRun
	started  int               // tests seen so far, to order a crashed package's tests
	results  map[testID]string // the result of each listed test that ended
	skips    []skip
	failed   bool
}

// runningTest is a test that has not ended yet and its output so far.
type runningTest struct {
	order int
	lines []string
}

// packageRun is a package in the stream: its own output lines (not its
// tests') until it reports a result.
type packageRun struct {
	lines []string
	done  bool
}

func newChecker(out io.Writer, allowed map[testID]string) *checker {
	return &checker{out: out, allowed: allowed, tests: map[testID]*runningTest{},
		packages: map[string]*packageRun{}, results: map[testID]string{}}
}

// line takes one line of the stream: an event, or anything else, which is
// printed as it is.
func (c *checker) line(b []byte) {
	var e event
	if err := json.Unmarshal(bytes.TrimSpace(b), &e); err != nil || e.Action == "" {
		c.out.Write(b)
		return
	}
	switch {
	case e.Action == "build-output":
		io.WriteString(c.out, e.Output)
	case e.Action == "build-fail":
		c.failed = true
	case e.Test == "":
		c.packageEvent(e)
	default:
		c.testEvent(e)
	}
}

// packageEvent takes an event of a package's own (no test named). A
// package that passed or had no tests shows only its last line, the go
// command's summary; a failed one shows its unfinished tests' output (a
// crash happens inside a test) and all its own.
func (c *checker) packageEvent(e event) {
	p := c.packages[e.Package]
	if p == nil {
		p = &packageRun{}
		c.packages[e.Package] = p
	}
	switch e.Action {
	case "output":
		p.lines = append(p.lines, e.Output)
	case "pass", "skip":
		if n := len(p.lines); n > 0 {
			io.WriteString(c.out, p.lines[n-1])
		}
		c.endPackage(e.Package, p, false)
	case "fail":
		c.failed = true
		c.endPackage(e.Package, p, true)
	}
}

// endPackage drops a package's held output, printing it first (its
// unfinished tests', in the order they started, then its own) if show.
func (c *checker) endPackage(pkg string, p *packageRun, show bool) {
	var left []testID
	for id := range c.tests {
		if id.Package == pkg {
			left = append(left, id)
		}
	}
	slices.SortFunc(left, func(a, b testID) int { return cmp.Compare(c.tests[a].order, c.tests[b].order) })
	for _, id := range left {
		if show {
			c.print(c.tests[id].lines)
		}
		delete(c.tests, id)
	}
	if show {
		c.print(p.lines)
	}
	p.lines, p.done = nil, true
}

// framing matches the lines go test -json's verbose run adds and plain go
// test never prints.
var framing = regexp.MustCompile(`^=== (RUN|PAUSE|CONT|NAME)\b`)

// testEvent takes an event of one test: its output is held until it ends,
// then printed if it failed and dropped otherwise.
func (c *checker) testEvent(e event) {
	id := testID{Package: e.Package, Test: e.Test}
	if c.packages[e.Package] == nil {
		c.packages[e.Package] = &packageRun{}
	}
	t := c.tests[id]
	if t == nil {
		c.started++
		t = &runningTest{order: c.started}
		c.tests[id] = t
	}
	switch e.Action {
	case "output":
		if !framing.MatchString(e.Output) {
			t.lines = append(t.lines, e.Output)
		}
		return
	case "pass", "bench":
		c.ended(id, "passed")
	case "fail":
		c.failed = true
		c.print(t.lines)
		c.ended(id, "failed")
	case "skip":
		reason := c.allowed[id]
		c.skips = append(c.skips, skip{testID: id, Message: skipMessage(t.lines), Reason: reason})
		c.ended(id, "skipped")
	default: // run, pause, cont, and actions skipcheck has no use for
		return
	}
	delete(c.tests, id)
}

// ended records a listed test's result.
func (c *checker) ended(id testID, result string) {
	if _, listed := c.allowed[id]; listed {
		c.results[id] = result
	}
}

func (c *checker) print(lines []string) {
	for _, l := range lines {
		io.WriteString(c.out, l)
	}
}

// skipMessage returns the last skipMessageLines lines a skipped test
// printed before its "--- SKIP" line, without line ends.
func skipMessage(lines []string) []string {
	var msg []string
	for _, l := range lines {
		if !strings.HasPrefix(strings.TrimSpace(l), "--- SKIP: ") {
			msg = append(msg, strings.TrimRight(l, "\n"))
		}
	}
	return msg[max(0, len(msg)-skipMessageLines):]
}

// finish ends the stream: the output of packages that never reported a
// result is printed, since it is all there is of them, and the report
// returned.
func (c *checker) finish() report {
	r := report{Skips: c.skips, Packages: len(c.packages), Failed: c.failed}
	for pkg, p := range c.packages {
		if !p.done {
			r.Unfinished = append(r.Unfinished, pkg)
		}
	}
	slices.Sort(r.Unfinished)
	for _, pkg := range r.Unfinished {
		c.endPackage(pkg, c.packages[pkg], true)
	}
	skipped := map[testID]bool{}
	for _, s := range c.skips {
		skipped[s.testID] = true
	}
	for id := range c.allowed {
		if c.packages[id.Package] == nil || skipped[id] {
			continue
		}
		result := c.results[id]
		if result == "" {
			result = "did not run"
		}
		r.Unskipped = append(r.Unskipped, unskipped{testID: id, Result: result})
	}
	slices.SortFunc(r.Unskipped, func(a, b unskipped) int { return cmp.Compare(a.String(), b.String()) })
	return r
}

// exitCode is skipcheck's exit status for the report (see the package
// documentation).
func (r report) exitCode() int {
	if r.Failed || r.Packages == 0 || len(r.Unfinished) > 0 || slices.ContainsFunc(r.Skips, skip.unlisted) {
		return 1
	}
	return 0
}

func (s skip) unlisted() bool { return s.Reason == "" }

// messagePrefix is the file:line a test's log line starts with.
var messagePrefix = regexp.MustCompile(`^\s*\S+\.go:\d+: `)

// write prints the report's summary; table names the table file.
func (r report) write(w io.Writer, table string) {
	unlisted := 0
	for _, s := range r.Skips {
		if s.unlisted() {
			unlisted++
		}
	}
	fmt.Fprintf(w, "\nskipcheck: tests skipped: %d, not listed in %s: %d\n", len(r.Skips), table, unlisted)
	for _, s := range r.Skips {
		if !s.unlisted() {
			fmt.Fprintf(w, "  listed      %s: %s\n", s, s.Reason)
			continue
		}
		fmt.Fprintf(w, "  NOT LISTED  %s, which printed:\n", s)
		for _, l := range s.Message {
			fmt.Fprintf(w, "                %s\n", l)
		}
		why := "(why it cannot run on the CI machine)"
		if n := len(s.Message); n > 0 {
			why = strings.ReplaceAll(strings.TrimSpace(messagePrefix.ReplaceAllString(s.Message[n-1], "")), "|", `\|`)
		}
		fmt.Fprintf(w, "              its row, if CI may skip it: | `%s` | `%s` | %s |\n", s.Package, s.Test, why)
	}
	if len(r.Unskipped) > 0 {
		fmt.Fprintf(w, "skipcheck: listed in %s but did not skip here (a row for a test CI runs goes):\n", table)
		for _, u := range r.Unskipped {
			fmt.Fprintf(w, "  %s: %s\n", u, u.Result)
		}
	}
	for _, pkg := range r.Unfinished {
		fmt.Fprintf(w, "skipcheck: %s never reported its result (the stream ended early)\n", pkg)
	}
	if r.Packages == 0 {
		fmt.Fprintln(w, "skipcheck: no package in the stream: did go test -json run?")
	}
	if r.Failed {
		fmt.Fprintln(w, "skipcheck: tests failed (above)")
	}
}
