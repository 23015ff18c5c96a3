// Package procs runs Berth as real processes for the crash-point and chaos
// suites: nats-server (one node or a 3-node cluster), `berth dispatcher`,
// `berth watchdog` and `berth agent` as child processes, each in its own
// process group with its output in a file, that a test can SIGKILL and
// restart; the GitHub simulator runs in the test process. Every wait has a
// deadline, and cleanup kills every process the system started, down to the
// simulated runners ("VMs") and exec steps, and checks that none is left.
package procs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/tests/harness"
)

// Bins are the binaries a system runs.
type Bins struct {
	Root   string // repository root
	Berth  string
	NATS   string // nats-server
	Runner string // the ghsim binary deploy/exec/sim-runner.sh starts as a "VM"
}

var (
	buildOnce sync.Once
	buildDir  string
	bins      Bins
	buildErr  error
)

// Main runs the tests and then removes the binaries built for them; call it
// from TestMain: os.Exit(procs.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	releasePorts()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	return code
}

// Build compiles berth, nats-server and the simulated runner once per test
// binary (later calls return the same paths), printing progress on stderr.
func Build(t testing.TB) Bins {
	t.Helper()
	buildOnce.Do(func() {
		start := time.Now()
		root, err := harness.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, err = os.MkdirTemp("", "berth-procs-bin-"); err != nil {
			buildErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		b := Bins{Root: root, Berth: filepath.Join(buildDir, "berth"), NATS: filepath.Join(buildDir, "nats-server")}
		for _, step := range []struct{ out, pkg string }{
			{b.Berth, "./services/cmd/berth"},
			{b.NATS, "github.com/nats-io/nats-server/v2"},
		} {
			fmt.Fprintf(os.Stderr, "procs: building %s (a minute on a cold cache)\n", step.pkg)
			cmd := exec.CommandContext(ctx, "go", "build", "-o", step.out, step.pkg)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", step.pkg, err, out)
				return
			}
		}
		fmt.Fprintln(os.Stderr, "procs: building the simulated runner (tests/cmd/ghsim)")
		if b.Runner, err = harness.BuildSimRunner(ctx, root, buildDir); err != nil {
			buildErr = err
			return
		}
		fmt.Fprintf(os.Stderr, "procs: binaries ready in %s after %s\n", buildDir, time.Since(start).Round(100*time.Millisecond))
		bins = b
	})
	if buildErr != nil {
		t.Fatalf("build: %v", buildErr)
	}
	return bins
}
