// Package markdown_test checks the project's Markdown from the repository
// root: tables render, relative links resolve, README.md stays short.
package markdown_test

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The project's Markdown renders as written: every table has its header and
// delimiter rows and the same number of cells in every row, every relative
// link and image names a file the project tracks (and a heading there, for
// a #anchor), and README.md stays short: at most maxReadmeLines lines, none
// wider than maxReadmeWidth outside tables and code blocks.
const (
	maxReadmeLines = 150
	maxReadmeWidth = 120
)

// TestMain runs the checks from the repository root, where git's paths
// and the links' targets are relative to.
func TestMain(m *testing.M) {
	if err := os.Chdir("../.."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// trackedFiles are the files git tracks (or would track: new files not
// ignored), slash-separated, relative to the repository root.
func trackedFiles(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := map[string]bool{}
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if _, err := os.Stat(f); err == nil { // not deleted in the work tree
			files[f] = true
		}
	}
	return files
}

func TestMarkdownRenders(t *testing.T) {
	files := trackedFiles(t)
	var docs []string
	for f := range files {
		// Vendored third-party files are theirs.
		if strings.HasSuffix(f, ".md") && !strings.Contains(f, "/vendor/") {
			docs = append(docs, f)
		}
	}
	if !files["README.md"] || len(docs) < 5 {
		t.Fatalf("found Markdown files %v; want README.md and the area READMEs", docs)
	}
	for _, name := range docs {
		doc, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range markdownProblems(name, doc, files, readHeadings(t)) {
			t.Errorf("%s", p)
		}
	}
}

// readHeadings returns the anchors of a tracked Markdown file's headings.
func readHeadings(t *testing.T) func(string) map[string]bool {
	return func(name string) map[string]bool {
		t.Helper()
		doc, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return headingAnchors(doc)
	}
}

var (
	fenceRE     = regexp.MustCompile("^\\s*(```|~~~)")
	delimCellRE = regexp.MustCompile(`^\s*:?-{3,}:?\s*$`)
	codeSpanRE  = regexp.MustCompile("`+[^`]*`+")
	linkRE      = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	headingRE   = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	slugDropRE  = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// cells counts a table row's cells: the text between unescaped pipes, the
// outer pipes optional.
func cells(line string) int {
	s := strings.TrimSpace(line)
	s = strings.TrimPrefix(s, "|")
	if strings.HasSuffix(s, "|") && !strings.HasSuffix(s, `\|`) {
		s = s[:len(s)-1]
	}
	n := 1
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '|':
			n++
		}
	}
	return n
}

func isDelimiterRow(line string) bool {
	s := strings.Trim(strings.TrimSpace(line), "|")
	for _, c := range strings.Split(s, "|") {
		if !delimCellRE.MatchString(c) {
			return false
		}
	}
	return true
}

// headingAnchors are the GitHub anchors of doc's headings.
func headingAnchors(doc []byte) map[string]bool {
	anchors := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(string(doc), "\n") {
		if fenceRE.MatchString(line) {
			inCode = !inCode
			continue
		}
		if m := headingRE.FindStringSubmatch(line); m != nil && !inCode {
			text := strings.ToLower(strings.ReplaceAll(m[1], "`", ""))
			anchors[strings.ReplaceAll(slugDropRE.ReplaceAllString(text, ""), " ", "-")] = true
		}
	}
	return anchors
}

// endsBlock reports whether a table may start right after line: a blank
// line, a one-line HTML comment (an HTML block that ends on its line, such
// as a generated table's marker) or a heading; after a paragraph line the
// rows would continue the paragraph.
func endsBlock(line string) bool {
	l := strings.TrimSpace(line)
	return l == "" || strings.HasPrefix(l, "<!--") && strings.HasSuffix(l, "-->") || headingRE.MatchString(l)
}

// markdownProblems lists what does not render or resolve in doc, the file
// name (relative to the repository root); tracked are the repository's
// files, headings reads a tracked Markdown file's anchors.
func markdownProblems(name string, doc []byte, tracked map[string]bool, headings func(string) map[string]bool) []string {
	var problems []string
	bad := func(line int, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s:%d: %s", name, line, fmt.Sprintf(format, args...)))
	}
	lines := strings.Split(strings.TrimSuffix(string(doc), "\n"), "\n")
	isReadme := name == "README.md"
	if isReadme && len(lines) > maxReadmeLines {
		bad(len(lines), "%d lines, more than %d", len(lines), maxReadmeLines)
	}
	// prose is doc with code blocks blanked, for the link check.
	prose := make([]string, len(lines))
	inCode := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if fenceRE.MatchString(line) {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		prose[i] = line
		if !strings.HasPrefix(strings.TrimSpace(line), "|") {
			if isReadme && len([]rune(line)) > maxReadmeWidth {
				bad(i+1, "%d characters, more than %d outside tables and code", len([]rune(line)), maxReadmeWidth)
			}
			continue
		}
		// A table: the run of lines starting with a pipe.
		start := i
		for i+1 < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i+1]), "|") {
			i++
			prose[i] = lines[i]
		}
		switch {
		case start > 0 && !endsBlock(lines[start-1]):
			bad(start+1, "table rows right after a paragraph line render as text: put a blank line before the table (or join the rows to the table above)")
		case i == start || !isDelimiterRow(lines[start+1]):
			bad(start+1, "table without a header and a delimiter row (| --- |) renders as text")
		case cells(lines[start+1]) != cells(lines[start]):
			bad(start+2, "delimiter row has %d cells, the header %d", cells(lines[start+1]), cells(lines[start]))
		default:
			for j := start + 2; j <= i; j++ {
				if got, want := cells(lines[j]), cells(lines[start]); got != want {
					bad(j+1, "row has %d cells, the header %d", got, want)
				}
			}
		}
	}
	// Links and images, outside code; a link's text may span lines.
	text := codeSpanRE.ReplaceAllStringFunc(strings.Join(prose, "\n"), func(s string) string {
		return strings.Repeat(" ", len(s)-strings.Count(s, "\n")) + strings.Repeat("\n", strings.Count(s, "\n"))
	})
	for _, m := range linkRE.FindAllStringSubmatchIndex(text, -1) {
		target := text[m[2]:m[3]]
		line := strings.Count(text[:m[0]], "\n") + 1
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		file, anchor, _ := strings.Cut(target, "#")
		resolved := name
		if file != "" {
			resolved = path.Join(path.Dir(name), file)
			if !tracked[resolved] && !trackedDir(tracked, resolved) {
				bad(line, "link %s: %s is not a tracked file", target, resolved)
				continue
			}
		}
		if anchor != "" {
			if !strings.HasSuffix(resolved, ".md") {
				continue
			}
			var anchors map[string]bool
			if resolved == name {
				anchors = headingAnchors(doc)
			} else {
				anchors = headings(resolved)
			}
			if !anchors[anchor] {
				bad(line, "link %s: %s has no heading #%s", target, resolved, anchor)
			}
		}
	}
	return problems
}

func trackedDir(tracked map[string]bool, dir string) bool {
	for f := range tracked {
		if strings.HasPrefix(f, dir+"/") {
			return true
		}
	}
	return false
}

func TestMarkdownProblems(t *testing.T) {
	tracked := map[string]bool{"README.md": true, "a/b.md": true, "a/pic.png": true}
	headings := func(string) map[string]bool { return map[string]bool{"the-part": true} }
	long := strings.Repeat("x", maxReadmeWidth+1)
	tests := []struct {
		name, file, doc string
		want            []string
	}{
		{"a good table", "a/b.md", "text\n\n| a | b |\n| --- | ---: |\n| 1 | `x\\|y` |\n", nil},
		{"rows split off by a paragraph", "a/b.md", "| a | b |\n| --- | --- |\n| 1 | 2 |\nA paragraph.\n| 3 | 4 |\n",
			[]string{"a/b.md:5: table rows right after a paragraph line render as text: put a blank line before the table (or join the rows to the table above)"}},
		{"a table after a marker comment or a heading", "a/b.md", "<!-- generated -->\n| a |\n| --- |\n\n## H\n| b |\n| --- |\n", nil},
		{"no delimiter row", "a/b.md", "\n| a | b |\n| 1 | 2 |\n",
			[]string{"a/b.md:2: table without a header and a delimiter row (| --- |) renders as text"}},
		{"delimiter of another width", "a/b.md", "| a | b |\n| --- |\n",
			[]string{"a/b.md:2: delimiter row has 1 cells, the header 2"}},
		{"a short row", "a/b.md", "| a | b |\n| --- | --- |\n| 1 |\n",
			[]string{"a/b.md:3: row has 1 cells, the header 2"}},
		{"links that resolve", "a/b.md", "[up](../README.md), ![p](pic.png), [dir](.), [h](#the-part), " +
			"[x](https://example.com), `[not](a/link.md)`\n\n## The part\n", nil},
		{"a link across lines", "README.md", "![a picture\nof it](a/pic.png)\n", nil},
		{"links that do not", "a/b.md", "[gone](../docs/x.md) and\n[no heading](../README.md#nowhere)\n", []string{
			"a/b.md:1: link ../docs/x.md: docs/x.md is not a tracked file",
			"a/b.md:2: link ../README.md#nowhere: README.md has no heading #nowhere",
		}},
		{"code is not checked", "README.md", "```\n[gone](nothing.md)\n| a |\n" + long + "\n```\n", nil},
		{"a wide README line", "README.md", long + "\n\n| " + long + " |\n| --- |\n",
			[]string{fmt.Sprintf("README.md:1: %d characters, more than %d outside tables and code", maxReadmeWidth+1, maxReadmeWidth)}},
		{"wide lines elsewhere are fine", "a/b.md", long + "\n", nil},
		{"a long README", "README.md", strings.Repeat("line\n", maxReadmeLines+1),
			[]string{fmt.Sprintf("README.md:%d: %d lines, more than %d", maxReadmeLines+1, maxReadmeLines+1, maxReadmeLines)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := markdownProblems(tt.file, []byte(tt.doc), tracked, headings)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}
