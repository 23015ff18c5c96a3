package crosscheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// darwinEnv is the build the vz backend runs in: macOS on Apple silicon,
// with cgo.
var darwinEnv = []string{"GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED=1"}

// listed is what `go list -json` says of one package for the build.
type listed struct {
	ImportPath, Dir                string
	GoFiles, CgoFiles, TestGoFiles []string
	Imports, TestImports           []string
	ImportMap                      map[string]string
	Error                          *struct{ Err string }
}

// list runs one `go list -deps -json` for the darwin build over paths:
// which files go/build selects (build tags, _darwin suffixes), without
// running cgo (only -compiled would).
func list(t *testing.T, paths ...string) map[string]*listed {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-e", "-deps", "-json"}, paths...)...)
	cmd.Env = append(os.Environ(), darwinEnv...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list for darwin/arm64: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]*listed{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = &p
	}
	return pkgs
}

// checker type-checks packages from source for the darwin build, every
// dependency from source too: this machine's export data is for its own
// GOOS, and packages such as x/sys/unix differ by GOOS.
type checker struct {
	fset  *token.FileSet
	index map[string]*listed
	pkgs  map[string]*types.Package
	root  string  // errors are collected for this package alone
	errs  []error // the root's type errors
}

// importer resolves the imports of one listed package (its ImportMap
// names the standard library's vendored packages).
type importer struct {
	c    *checker
	from *listed
}

func (im importer) Import(path string) (*types.Package, error) {
	if path == "unsafe" {
		return types.Unsafe, nil
	}
	if mapped, ok := im.from.ImportMap[path]; ok {
		path = mapped
	}
	return im.c.check(path)
}

// check type-checks the package at path (memoized). Only the root is
// checked in its function bodies, with its test files: a dependency's
// declarations are what the root uses, and a C.xxx in a dependency's body
// is no concern of ours.
func (c *checker) check(path string) (*types.Package, error) {
	if p, ok := c.pkgs[path]; ok {
		return p, nil
	}
	lp := c.index[path]
	if lp == nil {
		return nil, fmt.Errorf("%s: not in go list's answer", path)
	}
	if lp.Error != nil {
		return nil, fmt.Errorf("%s: %s", path, lp.Error.Err)
	}
	root := path == c.root
	names := append(append([]string{}, lp.GoFiles...), lp.CgoFiles...)
	if root {
		names = append(names, lp.TestGoFiles...) // vz_darwin_test.go too
	}
	var files []*ast.File
	for _, name := range names {
		f, err := parser.ParseFile(c.fset, filepath.Join(lp.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	conf := types.Config{Importer: importer{c, lp}, FakeImportC: true, Sizes: types.SizesFor("gc", "arm64"),
		IgnoreFuncBodies: !root, Error: func(err error) {
			if root {
				c.errs = append(c.errs, err)
			}
		}}
	p, _ := conf.Check(path, c.fset, files, nil)
	c.pkgs[path] = p
	return p, nil
}

// The vz backend, its darwin-only files and their test included,
// type-checks for darwin/arm64 with cgo. Cgo needs Apple's SDK, so `go
// vet` cannot do this off a Mac (doc.go); C itself stays unchecked.
func TestDarwinBuildTypeChecks(t *testing.T) {
	const vz = "github.com/berth-ci/berth/services/vmagent/backends/vz"
	first := list(t, vz)[vz]
	if first == nil || first.Error != nil {
		t.Fatalf("go list %s for darwin: %+v", vz, first)
	}
	var darwinOnly []string
	for _, f := range append(append(append([]string{}, first.GoFiles...), first.CgoFiles...), first.TestGoFiles...) {
		if strings.Contains(f, "darwin") {
			darwinOnly = append(darwinOnly, f)
		}
	}
	if len(darwinOnly) < 3 {
		t.Fatalf("go list selected darwin files %v for darwin/arm64 with cgo; want vz_darwin.go, detach_darwin.go and vz_darwin_test.go", darwinOnly)
	}
	c := &checker{fset: token.NewFileSet(), index: list(t, append([]string{vz}, first.TestImports...)...), pkgs: map[string]*types.Package{}, root: vz}
	if _, err := c.check(vz); err != nil {
		t.Fatal(err)
	}
	for _, err := range c.errs {
		t.Errorf("darwin/arm64 with cgo: %v", err)
	}
	t.Logf("%s type-checked for darwin/arm64 with cgo, with %v", vz, darwinOnly)
}
