package funclen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxLines is the longest a production function may be, counted from its
// func keyword to its closing brace.
const maxLines = 80

// allowed are the functions that may be longer, by package and name. Keep it
// to the fold's type switch: splitting it would hide which event changes
// what behind a second dispatch.
var allowed = map[string]bool{
	"events.(*Fleet).Apply": true,
}

// roots are the trees scanned, relative to this package's directory.
var roots = []string{"../../../events", "../.."}

// TestFunctionLength fails naming file:line and function for every function
// in a non-test file under events/ or services/ that is over maxLines and not
// allowed, and for every allowed one that no longer needs to be.
func TestFunctionLength(t *testing.T) {
	long := map[string]bool{}
	for _, root := range roots {
		for _, fn := range longFuncs(t, root) {
			if allowed[fn.name] {
				long[fn.name] = true
				continue
			}
			t.Errorf("%s:%d: %s is %d lines; split it into named steps of at most %d (issue 15)",
				fn.file, fn.line, fn.name, fn.lines, maxLines)
		}
	}
	for name := range allowed {
		if !long[name] {
			t.Errorf("%s is allowed to be over %d lines but is not (or is gone): drop it from the allowlist", name, maxLines)
		}
	}
}

// longFunc is one function over maxLines.
type longFunc struct {
	file  string // relative to the repository root
	line  int
	name  string // package.Func or package.(*Recv).Method
	lines int
}

// longFuncs parses every non-test .go file under root, whatever its build
// tags (darwin-only files count too), and returns its functions over
// maxLines.
func longFuncs(t *testing.T, root string) []longFunc {
	t.Helper()
	repo, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var out []longFunc
	// A missing root (a moved directory) reaches the walk function as an
	// error, so the test cannot pass by scanning nothing.
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" || d.Name() == "vendor" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(repo, abs)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			start, end := fset.Position(fn.Pos()).Line, fset.Position(fn.End()).Line
			if n := end - start + 1; n > maxLines {
				out = append(out, longFunc{file: filepath.ToSlash(rel), line: start, name: funcName(f.Name.Name, fn), lines: n})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// funcName is package.Func, or package.(*Recv).Method as the allowlist and
// stack traces spell it.
func funcName(pkg string, fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return pkg + "." + fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	star := ""
	if s, ok := typ.(*ast.StarExpr); ok {
		star, typ = "*", s.X
	}
	// Drop type parameters: (*Set[T]).Add is (*Set).Add.
	switch x := typ.(type) {
	case *ast.IndexExpr:
		typ = x.X
	case *ast.IndexListExpr:
		typ = x.X
	}
	recv := "?"
	if id, ok := typ.(*ast.Ident); ok {
		recv = id.Name
	}
	if star != "" {
		return pkg + ".(" + star + recv + ")." + fn.Name.Name
	}
	return pkg + "." + recv + "." + fn.Name.Name
}
