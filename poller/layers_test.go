package poller

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// floors is the package's house, top first (doc.go, "# Floors"). A file
// sees its own floor and those below it. Below the read path a floor is
// sealed: its files see only their own declarations and lower floors.
// owned says the floor's types own their state: only the declaring file
// writes their fields.
var floors = []struct {
	name          string
	sealed, owned bool
	files         []string
}{
	{"runner", false, false, []string{"poller.go", "run.go", "batch.go", "pipeline.go", "claim.go", "deliver.go",
		"finish.go", "backoff.go", "circuit.go", "health.go", "trace.go", "scripts.go", "pgkeys.go"}},
	{"read path", false, true, []string{"readpath.go"}},
	{"composed mechanisms", true, true, []string{"cursor.go", "late.go"}},
	{"mechanisms", true, true, []string{"gaps.go", "parked.go", "rescan.go", "coldpass.go", "rewind.go", "paused.go", "quiet.go",
		"latefound.go", "lateinherited.go", "sentmemory.go"}},
	{"values", true, false, []string{"item.go", "latecheck.go"}},
}

// floorOf returns the floor index of a file (0 is the top) and whether the
// table holds it.
func floorOf(file string) (int, bool) {
	for i, f := range floors {
		for _, name := range f.files {
			if name == file {
				return len(floors) - 1 - i, true
			}
		}
	}
	return 0, false
}

// checkedPackage type-checks the package's non-test files, with the
// imports read from the build's export data.
func checkedPackage(t *testing.T) (*token.FileSet, []*ast.File, *types.Info, *types.Package) {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	exports := map[string]string{}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if path, file, ok := strings.Cut(sc.Text(), " "); ok && file != "" {
			exports[path] = file
		}
	}
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	lookup := func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) }
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", lookup)}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Types: map[ast.Expr]types.TypeAndValue{},
		Selections: map[*ast.SelectorExpr]*types.Selection{}}
	pkg, err := conf.Check("github.com/outboxd/outboxd/poller", fset, files, info)
	if err != nil {
		t.Fatalf("type-checking poller: %v", err)
	}
	return fset, files, info, pkg
}

// Every reference inside poller runs to its own floor or a lower one: no
// mechanism calls a method, reads a field or names a type of the read path
// or the runner, and below the read path no file reaches a file of its own
// floor (late.go, latefound.go and lateinherited.go do not call each other
// in a cycle).
func TestNoReferenceRunsUpAFloor(t *testing.T) {
	fset, files, info, pkg := checkedPackage(t)
	for _, f := range files {
		file := filepath.Base(fset.File(f.Pos()).Name())
		if _, ok := floorOf(file); !ok && len(f.Decls) > 0 { // doc.go declares nothing
			t.Errorf("%s is on no floor: add it to the floors table here and in doc.go", file)
		}
	}
	var ups []string
	for id, obj := range info.Uses {
		if obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to {
			continue
		}
		fl, _ := floorOf(from)
		tl, _ := floorOf(to)
		sealed := floors[len(floors)-1-fl].sealed
		if tl > fl || (tl == fl && sealed) {
			ups = append(ups, fset.Position(id.Pos()).String()+": "+id.Name+" ("+to+")")
		}
	}
	sort.Strings(ups)
	for _, u := range ups {
		t.Errorf("a reference runs up a floor: %s", u)
	}
}

// On the read path and the mechanism floors, a type's fields (and a map or
// slice type's elements) are written only in the file that declares the
// type: a caller asks a mechanism through its methods and never sets its
// state. The runner's types and the plain values are exempt.
func TestMechanismStateIsWrittenOnlyByItsOwnFile(t *testing.T) {
	fset, files, info, pkg := checkedPackage(t)
	var bad []string
	check := func(file string, e ast.Expr) {
		for e != nil {
			var decl token.Pos
			next := ast.Expr(nil)
			switch x := e.(type) {
			case *ast.ParenExpr:
				next = x.X
			case *ast.StarExpr:
				next = x.X
			case *ast.IndexExpr:
				if n, ok := types.Unalias(info.TypeOf(x.X)).(*types.Named); ok && n.Obj().Pkg() == pkg {
					decl = n.Obj().Pos()
				}
				next = x.X
			case *ast.SelectorExpr:
				if s, ok := info.Selections[x]; ok && s.Kind() == types.FieldVal && s.Obj().Pkg() == pkg {
					decl = s.Obj().Pos()
				}
				next = x.X
			}
			if decl.IsValid() {
				owner := filepath.Base(fset.Position(decl).Filename)
				if fl, _ := floorOf(owner); owner != file && floors[len(floors)-1-fl].owned {
					bad = append(bad, fset.Position(e.Pos()).String()+": "+types.ExprString(e)+" (owned by "+owner+")")
				}
			}
			e = next
		}
	}
	for _, f := range files {
		file := filepath.Base(fset.File(f.Pos()).Name())
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.AssignStmt:
				if x.Tok != token.DEFINE {
					for _, l := range x.Lhs {
						check(file, l)
					}
				}
			case *ast.IncDecStmt:
				check(file, x.X)
			case *ast.UnaryExpr:
				if x.Op == token.AND {
					check(file, x.X)
				}
			case *ast.CallExpr:
				if id, ok := x.Fun.(*ast.Ident); ok && (id.Name == "delete" || id.Name == "clear") && len(x.Args) > 0 {
					if _, builtin := info.Uses[id].(*types.Builtin); builtin {
						check(file, x.Args[0])
					}
				}
			}
			return true
		})
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("mechanism state written outside its file: %s", b)
	}
}
