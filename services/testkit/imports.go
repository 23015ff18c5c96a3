package testkit

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Package is one package as `go list -json` describes it: its import
// path, its direct imports and every package it depends on, transitively
// (standard library included), test files excluded.
type Package struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// DependsOn reports whether p reaches an import path equal to, or under,
// prefix (a prefix ending in "/" matches only below it), directly or not.
func (p Package) DependsOn(prefix string) (string, bool) {
	for _, d := range p.Deps {
		if Under(d, prefix) {
			return d, true
		}
	}
	return "", false
}

// Under reports whether path is prefix or below it; a prefix ending in "/"
// (like "github.com/aws/") matches below it only.
func Under(path, prefix string) bool {
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(path, prefix)
	}
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// Imports lists the packages matching pattern (e.g.
// "github.com/berth-ci/berth/..."), run from the repository root so that
// go.work's modules all count, for the host's GOOS or the one in goos when
// it is not empty (vz builds only on darwin). It skips the test when the
// go command is not on PATH and fails it when go list does.
func Imports(t testing.TB, goos, pattern string) []Package {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	cmd := exec.Command(gobin, "list", "-e", "-json=ImportPath,Imports,Deps,Error", pattern)
	cmd.Dir = RepoRoot(t)
	cmd.Env = os.Environ()
	if goos != "" {
		cmd.Env = append(cmd.Env, "GOOS="+goos, "CGO_ENABLED=1")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pattern, err, stderr.String())
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			Package
			Error *struct{ Err string }
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list %s: %v", pattern, err)
		}
		if p.Error != nil {
			t.Fatalf("go list %s: %s: %s", pattern, p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p.Package)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list %s: no packages", pattern)
	}
	return pkgs
}
