// Package scenario turns the field fault scenarios (shared/scenarios.md,
// ids like BL-01) about slot leaks, teardown, cancellation while
// provisioning, runaway provisioning and cordons into given-when-then tests
// through the real services: embedded NATS, the dispatcher, the watchdog and
// vmagents driving the exec backend, whose steps run deploy/exec/faults.sh
// around deploy/exec/sim-runner.sh, with the GitHub simulator sending signed
// webhooks and running the JIT runners.
//
// Each test names the scenario ids it covers in its doc comment, shapes its
// fleet with harness.Options.Tune, switches faults on and off through the
// fault script's control directory while the system runs, and reads the
// live projection (the dispatcher's fold) and the log. Every wait polls a
// condition under a deadline, and every test runs under a context deadline.
package scenario

import (
	"testing"

	"go.uber.org/goleak"
)

// The whole system runs in-process; when a test stops it, no goroutine of
// Berth's may outlive it (law 5).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats-server keeps a few process-wide goroutines after Shutdown.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).logRejectedTLSConns"),
		goleak.IgnoreTopFunction("time.Sleep"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
