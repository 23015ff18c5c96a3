package testkit

import "go.uber.org/goleak"

// LeakOptions are the goroutines of embedded nats-servers that a package's
// goleak check (goleak.VerifyTestMain(m, testkit.LeakOptions()...)) must
// not count: process-wide ones nats-server keeps after Shutdown, and a
// stopped stream's file-store flusher and the access-time service, which
// return only some time after WaitForShutdown on a loaded machine (seen
// under -race on 2 busy cores). Berth's own goroutines are still checked.
func LeakOptions() []goleak.Option {
	const srv = "github.com/nats-io/nats-server/v2/server"
	return []goleak.Option{
		goleak.IgnoreAnyFunction(srv + ".(*Server).startGoRoutine.func1"),
		goleak.IgnoreTopFunction(srv + ".(*Server).logRejectedTLSConns"),
		goleak.IgnoreTopFunction(srv + ".(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction(srv + "/ats.Register.func1"),
	}
}
