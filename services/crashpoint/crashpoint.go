// Package crashpoint is a test seam for the crash-point suite (tests/crash):
// it lets a test kill a service process with SIGKILL at a named point
// between two of its side effects, to prove that every reaction is
// idempotent and the fleet heals after a restart (law 9).
//
// A point is armed by the environment variable BERTH_CRASH_AT, read once at
// the first Hit: "NAME" kills the process at the first hit of that point,
// "NAME@N" at its Nth hit. Unset (production), Hit costs one atomic load.
//
// The points, in the order a job meets them:
//
//	dispatcher.after-intake      a webhook's fact is stored, before the 2xx answer to GitHub
//	dispatcher.after-reserve     a slot reservation is stored, before the JIT config is minted
//	dispatcher.after-mint        a JIT config is minted, before the placement is appended
//	agent.after-provisioning     "provisioning" is stored, before the backend's create runs
//	agent.after-create           the backend's create returned, before its outcome (runner started) is stored
//	dispatcher.before-release    a job's end is folded, before the slot release is appended
//	dispatcher.after-release     a release is stored, before the teardown request
//	watchdog.before-release      a deadline passed, before the watchdog's release is appended
//	watchdog.after-release       the watchdog's release is stored, before its teardown request
//	agent.before-stop            a teardown is folded, before the backend's stop runs
//	agent.after-stop             the backend's stop returned, before the stopped fact is stored
package crashpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Env is the variable that arms a crash point.
const Env = "BERTH_CRASH_AT"

// The crash points; All lists them.
const (
	DispatcherAfterIntake   = "dispatcher.after-intake"
	DispatcherAfterReserve  = "dispatcher.after-reserve"
	DispatcherAfterMint     = "dispatcher.after-mint"
	DispatcherBeforeRelease = "dispatcher.before-release"
	DispatcherAfterRelease  = "dispatcher.after-release"
	AgentAfterProvisioning  = "agent.after-provisioning"
	AgentAfterCreate        = "agent.after-create"
	AgentBeforeStop         = "agent.before-stop"
	AgentAfterStop          = "agent.after-stop"
	WatchdogBeforeRelease   = "watchdog.before-release"
	WatchdogAfterRelease    = "watchdog.after-release"
)

// All is every crash point, for tests that iterate them.
var All = []string{
	DispatcherAfterIntake, DispatcherAfterReserve, DispatcherAfterMint, DispatcherBeforeRelease, DispatcherAfterRelease,
	AgentAfterProvisioning, AgentAfterCreate, AgentBeforeStop, AgentAfterStop,
	WatchdogBeforeRelease, WatchdogAfterRelease,
}

// Service names the service (the berth subcommand) a point belongs to:
// "dispatcher", "agent" or "watchdog".
func Service(point string) string {
	s, _, _ := strings.Cut(point, ".")
	return s
}

// state: 0 not read yet, 1 unset (Hit returns at once), 2 armed.
var state atomic.Int32

var (
	once  sync.Once
	armed string
	at    int64 = 1
	hits  atomic.Int64
)

// Hit kills the process with SIGKILL if BERTH_CRASH_AT names this point (and
// this is its Nth hit, for "NAME@N"). It never returns when it kills.
func Hit(name string) {
	if state.Load() == 1 {
		return
	}
	once.Do(load)
	if state.Load() != 2 || name != armed {
		return
	}
	if hits.Add(1) != at {
		return
	}
	fmt.Fprintf(os.Stderr, "crashpoint: %s hit %d: SIGKILL\n", name, at)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not deliverable late, but never go on past a crash point
}

func load() {
	v := strings.TrimSpace(os.Getenv(Env))
	if v == "" {
		state.Store(1)
		return
	}
	name, n, ok := strings.Cut(v, "@")
	if ok {
		k, err := strconv.ParseInt(n, 10, 64)
		if err != nil || k < 1 {
			fmt.Fprintf(os.Stderr, "crashpoint: %s=%q: the count after @ must be a positive integer; no crash point armed\n", Env, v)
			state.Store(1)
			return
		}
		at = k
	}
	armed = name
	state.Store(2)
}
