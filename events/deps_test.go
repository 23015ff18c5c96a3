package events_test

import (
	"os/exec"
	"strings"
	"testing"
)

// forbidden are import paths events must never reach, directly or not: the
// fold has no I/O, so any tool can fold the log (DESIGN: "events imports no
// NATS server, GitHub or AWS code").
var forbidden = []string{
	"github.com/nats-io/",
	"github.com/google/go-github",
	"github.com/aws/",
	"net/http",
}

func TestEventsImportsNoNATSGitHubAWSOrHTTP(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	out, err := exec.Command(gobin, "list", "-deps", "github.com/berth-ci/berth/events").Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, msg)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 || deps[len(deps)-1] != "github.com/berth-ci/berth/events" {
		t.Fatalf("go list -deps did not list the events package itself: %q", deps)
	}
	for _, dep := range deps {
		for _, bad := range forbidden {
			if dep == strings.TrimSuffix(bad, "/") || strings.HasPrefix(dep, bad) {
				t.Errorf("events depends on %s (matches %q)", dep, bad)
			}
		}
	}
}
