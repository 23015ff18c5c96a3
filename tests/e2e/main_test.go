package e2e

import (
	"testing"

	"go.uber.org/goleak"
)

// The whole system runs in-process in these tests; when it is stopped, no
// goroutine of Berth's may outlive it (law 5).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats-server keeps a few process-wide goroutines after Shutdown.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine.func1"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).logRejectedTLSConns"),
		goleak.IgnoreTopFunction("time.Sleep"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
