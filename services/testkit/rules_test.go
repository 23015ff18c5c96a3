package testkit_test

import (
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/berth-ci/berth/services/testkit"
)

// The dependency rules of DESIGN.md ("Dependency rules worth a test") and
// issue 15, checked over every package of the workspace as `go list` sees
// it, for this machine's GOOS and for darwin (where backends/vz builds).
// Each rule names the packages it binds and the import paths they must not
// reach, directly or through anything else.

const mod = "github.com/berth-ci/berth/"

// wiring is where the parts are put together: only it (and tests) may
// start an embedded server or pick a backend.
var wiring = []string{mod + "services/run", mod + "services/cmd", mod + "services/testkit", mod + "tests"}

func isWiring(path string) bool {
	return slices.ContainsFunc(wiring, func(w string) bool { return testkit.Under(path, w) })
}

type rule struct {
	name    string
	binds   func(pkg string) bool
	reaches []string // import path prefixes (see testkit.Under)
}

var rules = []rule{{
	// The fold has no I/O, so any tool can fold the log.
	name:    "events imports no NATS, GitHub, AWS or HTTP code",
	binds:   func(p string) bool { return testkit.Under(p, mod+"events") },
	reaches: []string{"github.com/nats-io/", "github.com/google/go-github", "github.com/bradleyfalzon/ghinstallation", "github.com/aws/", "net/http"},
}, {
	// The vmagent never holds GitHub credentials, nor decides placement.
	name:    "the vmagent and its backends import no GitHub client nor the dispatcher",
	binds:   func(p string) bool { return testkit.Under(p, mod+"services/vmagent") },
	reaches: []string{"github.com/google/go-github", "github.com/bradleyfalzon/ghinstallation", mod + "services/dispatch"},
}, {
	// Services reach NATS as clients; the server is started by wiring.
	name: "only wiring imports the embedded nats-server",
	binds: func(p string) bool {
		return !isWiring(p) && !testkit.Under(p, mod+"services/natsembed")
	},
	reaches: []string{mod + "services/natsembed", "github.com/nats-io/nats-server/v2/server"},
}, {
	// The agent reaches EC2 only through the backend interface.
	name:    "only the ec2 backend and wiring import the AWS SDK",
	binds:   func(p string) bool { return !isWiring(p) && !testkit.Under(p, mod+"services/vmagent/backends/ec2") },
	reaches: []string{"github.com/aws/"},
}}

// backendRule: backends are reached only through the backend interface, so
// nothing but backends/X itself and wiring imports backends/X.
func backendRule(pkgs []testkit.Package) []rule {
	var out []rule
	for _, p := range pkgs {
		b, ok := strings.CutPrefix(p.ImportPath, mod+"services/vmagent/backends/")
		if !ok || strings.Contains(b, "/") {
			continue
		}
		x := p.ImportPath
		out = append(out, rule{
			name:    "only wiring imports backends/" + b,
			binds:   func(p string) bool { return !isWiring(p) && !testkit.Under(p, x) },
			reaches: []string{x},
		})
	}
	return out
}

func TestImportRules(t *testing.T) {
	if testing.Short() {
		t.Skip("go list over the workspace takes a few seconds")
	}
	for _, goos := range []string{runtime.GOOS, "darwin"} {
		pkgs := testkit.Imports(t, goos, mod+"...")
		for _, r := range append(slices.Clone(rules), backendRule(pkgs)...) {
			bound := 0
			for _, p := range pkgs {
				if !r.binds(p.ImportPath) {
					continue
				}
				bound++
				for _, bad := range r.reaches {
					if dep, ok := p.DependsOn(bad); ok {
						t.Errorf("%s (GOOS=%s): %s depends on %s", r.name, goos, p.ImportPath, dep)
					}
				}
			}
			if bound == 0 {
				t.Errorf("%s (GOOS=%s): binds no package; is the rule stale?", r.name, goos)
			}
		}
	}
}

// Given a package list where events reaches NATS and dispatch reaches a
// backend, when the rules run over it, then both are caught: the checker
// itself can fail.
func TestImportRulesCatchABreach(t *testing.T) {
	pkgs := []testkit.Package{
		{ImportPath: mod + "events", Deps: []string{"github.com/nats-io/nats.go"}},
		{ImportPath: mod + "services/dispatch", Deps: []string{mod + "services/vmagent/backends/exec"}},
		{ImportPath: mod + "services/vmagent/backends/exec"},
		{ImportPath: mod + "services/run", Deps: []string{mod + "services/vmagent/backends/exec", mod + "services/natsembed"}},
	}
	var caught []string
	for _, r := range append(slices.Clone(rules), backendRule(pkgs)...) {
		for _, p := range pkgs {
			if !r.binds(p.ImportPath) {
				continue
			}
			for _, bad := range r.reaches {
				if _, ok := p.DependsOn(bad); ok {
					caught = append(caught, strings.TrimPrefix(p.ImportPath, mod)+" breaks "+r.name)
				}
			}
		}
	}
	want := []string{"events breaks events imports no NATS, GitHub, AWS or HTTP code", "services/dispatch breaks only wiring imports backends/exec"}
	if !slices.Equal(caught, want) {
		t.Fatalf("caught %q, want %q", caught, want)
	}
}
