// Command skipcheck holds `make test` to the project's rule on skips: a
// test may skip in CI only where test/skips.md lists it, with its reason;
// a suite that counts a skip as a pass is a defect. Plain `go test` does
// not even show skips, so `make test` runs `go test -json` into
//
//	go run ./localrun/cmd/skipcheck test/skips.md
//
// which reads the test2json events on stdin and
//   - prints what plain `go test` (without -v or -bench) would print, so
//     the log reads as before: a passing package's summary line ("ok ...",
//     "? ... [no test files]"), the output of every failed test less the
//     verbose run's framing ("=== RUN" and the like), and all the output of
//     a failed package: its tests that never finished (a crash) and its own
//     lines; the build's output as it comes;
//   - prints every line that is not a test2json event as it is: the go
//     command's own messages when its stderr is merged in. Such a line fails
//     nothing by itself: a go command that cannot run the tests exits
//     non-zero, which `set -o pipefail` turns into make's failure;
//   - at the end prints every test that skipped, with the table's reason,
//     or marked NOT LISTED with its skip message and the row to add; and
//     every listed test of a package in the stream that did not skip, so a
//     stale row is seen and goes.
//
// The table is test/skips.md's one Markdown table, with the columns
// package (import path), test (the full name go test reports, subtests
// with their path) and why it skips here. Names match exactly: a row allows
// one test, never its subtests, so a row has one meaning.
//
// Exit status: 0 when every skip is listed and nothing failed; 1 when a
// skip is not listed, a test, package or build failed, a package never
// reported its result, or the stream held no package at all (go test did
// not run); 2, at once and before reading any event, when the table cannot
// be read or is malformed (no table, another header, an empty cell, a
// duplicate row). Under `go run` any of these is go's exit status 1, after
// its line "exit status N".
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go test -json ... | skipcheck test/skips.md")
		os.Exit(2)
	}
	table := os.Args[1]
	allowed, err := readTable(table)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipcheck:", err)
		os.Exit(2)
	}
	out := bufio.NewWriter(os.Stdout)
	r, err := check(os.Stdin, out, allowed)
	if err != nil {
		out.Flush()
		fmt.Fprintln(os.Stderr, "skipcheck:", err)
		os.Exit(1)
	}
	r.write(out, table)
	out.Flush()
	os.Exit(r.exitCode())
}

// readTable reads and parses the table file at path.
func readTable(path string) (map[testID]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	allowed, err := parseTable(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return allowed, nil
}

// check follows the event stream in to its end, printing to out as it goes
// (flushed after each line, so the log keeps pace with the tests), and
// returns what it saw.
func check(in io.Reader, out *bufio.Writer, allowed map[testID]string) (report, error) {
	c := newChecker(out, allowed)
	r := bufio.NewReader(in)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			c.line(line)
			if ferr := out.Flush(); ferr != nil {
				return report{}, ferr
			}
		}
		if errors.Is(err, io.EOF) {
			rep := c.finish()
			return rep, out.Flush()
		}
		if err != nil {
			return report{}, err
		}
	}
}
