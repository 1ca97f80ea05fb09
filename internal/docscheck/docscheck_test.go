package docscheck

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// workWords are what the repository's prose must not contain: it speaks of
// the product, not of how it was made.
var workWords = []struct {
	name string
	re   *regexp.Regexp
}{
	{"a work session", regexp.MustCompile(`(?i)\bsessions? [0-9]+\b|\bhelper('s|s'?)? sessions?\b`)},
	{"a branch", regexp.MustCompile(`(?i)\bbranch(es)?\b`)},
	{"an issue number", regexp.MustCompile(`(?i)\bissues?[ -]?#?[0-9]+\b`)},
	{"a review", regexp.MustCompile(`(?i)\breview(ed|s)?\b|\bfindings? [0-9]+[a-z]?\b`)},
	{"a work date", regexp.MustCompile(`\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b`)},
	{"a commit hash", regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)},
}

// hexWord tells a commit hash from a word or a number: it has a digit and a
// letter, and it is not a name the product uses (hexNames).
var hexDigit, hexLetter = regexp.MustCompile(`[0-9]`), regexp.MustCompile(`[a-f]`)

// hexNames are words of the product's that look like a short hash.
var hexNames = map[string]bool{"ed25519": true}

// codeSpan is Markdown inline code: names, values and commands, not prose.
var codeSpan = regexp.MustCompile("`[^`]*`")

// offences returns what of workWords one line of prose contains.
func offences(line string) []string {
	line = codeSpan.ReplaceAllString(line, "``")
	var out []string
	for _, w := range workWords {
		for _, m := range w.re.FindAllString(line, -1) {
			if w.name == "a commit hash" && (hexNames[m] || !(hexDigit.MatchString(m) && hexLetter.MatchString(m))) {
				continue
			}
			out = append(out, fmt.Sprintf("%s (%q)", w.name, m))
		}
	}
	return out
}

// root is the module's root: the folder above this package holding go.mod.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("no go.mod at the module root %s: %v", dir, err)
	}
	return dir
}

// markdownFiles are README.md, BENCHMARKS.md and docs/**/*.md, relative to
// the root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "BENCHMARKS.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			files = append(files, filepath.ToSlash(rel))
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// proseLines calls f with each line of a Markdown file outside fenced code
// blocks, with its number.
func proseLines(t *testing.T, path string, f func(n int, line string)) {
	t.Helper()
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	fenced := false
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			f(n, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestDocsSpeakOfTheProductAlone(t *testing.T) {
	root := root(t)
	for _, md := range markdownFiles(t, root) {
		proseLines(t, filepath.Join(root, md), func(n int, line string) {
			for _, o := range offences(line) {
				t.Errorf("%s:%d names %s: say what the product does, not how it was made", md, n, o)
			}
		})
	}
}

// goComments returns the comment lines of every Go file under the root,
// tests and the bench module included ("line\x00text"), by path relative to
// the root; code blocks of doc comments are left out. Of a _test.go file it
// also returns the test functions' names, as words, and the subtest names
// and failure messages written as string literals (testWords).
func goComments(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		out[rel] = []string{}
		for _, g := range f.Comments {
			for _, c := range g.List {
				pos := fset.Position(c.Pos())
				for i, line := range strings.Split(c.Text, "\n") {
					if strings.HasPrefix(strings.TrimPrefix(line, "//"), "\t") {
						continue // a code block of a doc comment: a command or a value
					}
					out[rel] = append(out[rel], fmt.Sprintf("%d\x00%s", pos.Line+i, line))
				}
			}
		}
		if strings.HasSuffix(p, "_test.go") {
			out[rel] = append(out[rel], testWords(fset, f)...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// testFunc names a test, benchmark, example or fuzz function.
var testFunc = regexp.MustCompile(`^(Test|Benchmark|Example|Fuzz)[A-Z0-9_]`)

// nameWord splits a Go name into words: TestDrainIn2Steps is "Test Drain In 2 Steps".
var nameWord = regexp.MustCompile(`[A-Z]+[a-z]*|[a-z]+|[0-9]+`)

// testCalls are the testing methods whose first argument, a string
// literal, names a subtest or says why a test failed or was skipped.
var testCalls = map[string]bool{
	"Run": true, "Error": true, "Errorf": true, "Fatal": true, "Fatalf": true,
	"Log": true, "Logf": true, "Skip": true, "Skipf": true,
}

// testWords returns the names of f's test functions, as words, and the
// lines of the string literals that open a testCalls call ("line\x00text").
func testWords(fset *token.FileSet, f *ast.File) []string {
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			if testFunc.MatchString(n.Name.Name) {
				words := strings.Join(nameWord.FindAllString(n.Name.Name, -1), " ")
				out = append(out, fmt.Sprintf("%d\x00%s", fset.Position(n.Pos()).Line, words))
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || !testCalls[sel.Sel.Name] || len(n.Args) == 0 {
				return true
			}
			lit, ok := n.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			text, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			line := fset.Position(lit.Pos()).Line
			for i, l := range strings.Split(text, "\n") {
				out = append(out, fmt.Sprintf("%d\x00%s", line+i, l))
			}
		}
		return true
	})
	return out
}

func TestGoCommentsSpeakOfTheProductAlone(t *testing.T) {
	root := root(t)
	files := goComments(t, root)
	for path, lines := range files {
		for _, l := range lines {
			n, line, _ := strings.Cut(l, "\x00")
			for _, o := range offences(line) {
				t.Errorf("%s:%s: a comment, test name or test message names %s: say what the code does and why, not how it was made", path, n, o)
			}
		}
	}
}

// mdLink is a Markdown link or image: [text](target) or ![alt](target).
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

func TestRelativeLinksResolve(t *testing.T) {
	root := root(t)
	for _, md := range markdownFiles(t, root) {
		dir := filepath.Dir(filepath.Join(root, md))
		proseLines(t, filepath.Join(root, md), func(n int, line string) {
			line = codeSpan.ReplaceAllString(line, "``")
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
					continue
				}
				target, _, _ = strings.Cut(target, "#")
				if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(target))); err != nil {
					t.Errorf("%s:%d links to %s, which does not exist", md, n, m[1])
				}
			}
		})
	}
}

// TestTheCheckCatchesWhatItLooksFor keeps the patterns honest: each sample
// must be found, and the product's own words must not be.
func TestTheCheckCatchesWhatItLooksFor(t *testing.T) {
	for _, s := range []string{
		"measured in session 12", "while helper sessions ran", "on branch `tail`",
		"issue 17", "issue #21", "a review finding", "Findings 5a and 11", "on 2026-11-24", "the build before it (5b0c8bc)",
	} {
		if len(offences(s)) == 0 {
			t.Errorf("%q: nothing found", s)
		}
	}
	for _, s := range []string{
		"the producer's session holds a snapshot", "`1:hog0kqe6sw.063a9897`", "deadbeef", "1234567",
		"dead at `2026-11-24T02:51:10Z`", "outboxd_late_commits_total", "finding its delivered mark",
	} {
		if o := offences(s); len(o) > 0 {
			t.Errorf("%q: found %v", s, o)
		}
	}
}

// TestTestNamesAndMessagesAreChecked keeps testWords honest: a test's name,
// a subtest's name and a failure message are each looked at.
func TestTestNamesAndMessagesAreChecked(t *testing.T) {
	src := `package p

import "testing"

func TestIssue21Relay(t *testing.T) {
	t.Run("from session 5", func(t *testing.T) {})
	t.Errorf("a review finding %d", 1)
	_ = "issue 17" // data, not a message: not looked at
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p_test.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, l := range testWords(fset, f) {
		n, line, _ := strings.Cut(l, "\x00")
		for _, o := range offences(line) {
			found = append(found, n+": "+o)
		}
	}
	want := []string{`5: an issue number ("Issue 21")`, `6: a work session ("session 5")`, `7: a review ("review")`}
	if !slices.Equal(found, want) {
		t.Errorf("found %q, want %q", found, want)
	}
}

// listRow is a Markdown table row keyed by a metric or a log line's msg, or
// the header of such a table: what only docs/reference.md lists.
var listRow = regexp.MustCompile("^\\|\\s*`?(outboxd_[a-z_]+|msg|metric)`?\\s*\\|")

// TestReferenceIsTheOneListOfMetricsAndLogLines keeps one home per fact:
// docs/reference.md lists the metrics and the log lines; every other page
// links to it and never carries a table of them, which would drift.
func TestReferenceIsTheOneListOfMetricsAndLogLines(t *testing.T) {
	root := root(t)
	for _, md := range markdownFiles(t, root) {
		if filepath.ToSlash(md) == "docs/reference.md" {
			continue
		}
		proseLines(t, filepath.Join(root, md), func(n int, line string) {
			if listRow.MatchString(line) {
				t.Errorf("%s:%d lists a metric or a log line in a table; docs/reference.md is their one list: link to it", md, n)
			}
		})
	}
}
