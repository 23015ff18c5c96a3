// Package crash is the crash-point suite (issue 4): for every named crash
// point of services/crashpoint, the service that owns it runs as its own
// process with BERTH_CRASH_AT set, dies by SIGKILL between two of its side
// effects while jobs flow, is restarted without it, and the test proves that
// the fleet heals: every job served exactly once (or given up on with a
// reason), no slot held, no VM alive, no attempt with two VMs, and
// `berth replay --check` finds no difference on the restarted services.
package crash

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/crashpoint"
	"github.com/berth-ci/berth/tests/ghsim"
	"github.com/berth-ci/berth/tests/procs"
)

func TestMain(m *testing.M) { os.Exit(procs.Main(m)) }

// crashCase is one crash point: at which of its hits the process dies, and
// what heals the fleet afterwards.
type crashCase struct {
	point string
	at    int // the Nth hit kills
	// deadlines: some jobs' first attempts start no runner, and GitHub
	// rate-limits the first runner deletion for 20 s, so the dispatcher
	// cannot deregister them at their registration deadline and the
	// watchdog's own fallback (three deadlines) releases their slots. The
	// watchdog releases nothing on a healthy run.
	deadlines bool
	heals     string
}

// The healing mechanism of each crash point, in the order a job meets them.
var cases = []crashCase{
	{point: crashpoint.DispatcherAfterIntake, at: 3,
		heals: "The fact is stored under the delivery id but GitHub saw no answer: the delivery is redelivered " +
			"(GitHub's redeliver-failed-deliveries job, played by the test) and the intake answers 202 duplicate; " +
			"deliveries made while the dispatcher is down are redelivered, and the reconcile poll looks up jobs whose facts stopped."},
	{point: crashpoint.DispatcherAfterReserve, at: 2,
		heals: "The reservation is in the log: the restarted dispatcher folds it as a held, unplaced attempt and " +
			"mints for the same attempt id (law 1 holds: the booking came first)."},
	{point: crashpoint.DispatcherAfterMint, at: 2,
		heals: "GitHub holds a registration for the attempt but the log has no placement: the restarted dispatcher " +
			"mints again, GitHub answers 409 (the name exists), which is retried without placing; the watchdog's " +
			"provisioning deadline releases the slot and the job is booked again with a fresh attempt. The orphan " +
			"registration never runs (no VM has its JIT config) and GitHub drops it."},
	{point: crashpoint.AgentAfterProvisioning, at: 2,
		heals: "\"provisioning\" is stored but the create never ran: the restarted agent does not create twice; the " +
			"watchdog's provisioning deadline releases the slot, the teardown's stop finds no VM (success), and " +
			"the job is booked again."},
	{point: crashpoint.AgentAfterCreate, at: 2,
		heals: "The VM runs but its start is not recorded: its runner takes a job anyway (bound by the in_progress " +
			"webhook), and the slot is released at completion; if it took none, the provisioning deadline releases " +
			"it. Either way the teardown stops the VM the crash left behind."},
	{point: crashpoint.DispatcherBeforeRelease, at: 1,
		heals: "The job's end is in the log: the restarted dispatcher folds it and decides the same release, with " +
			"the same deterministic id."},
	{point: crashpoint.DispatcherAfterRelease, at: 2,
		heals: "The release is stored: the restarted dispatcher sees a released, placed attempt without a teardown " +
			"request and appends it."},
	{point: crashpoint.WatchdogBeforeRelease, at: 1, deadlines: true,
		heals: "The deadline is derived from the log and the clock: the restarted watchdog decides the same " +
			"release again (its id is deterministic, its append checks the pool ledger's sequence)."},
	{point: crashpoint.WatchdogAfterRelease, at: 1, deadlines: true,
		heals: "The release is stored without the watchdog's teardown request: the dispatcher requests the " +
			"teardown of every released, placed attempt, whoever released it."},
	{point: crashpoint.AgentBeforeStop, at: 2,
		heals: "The teardown request is in the log and no stopped fact: the restarted agent stops the VM."},
	{point: crashpoint.AgentAfterStop, at: 2,
		heals: "The VM is gone but its stop is not recorded: the restarted agent stops it again, which finds " +
			"nothing and succeeds (a stop is idempotent), and records it stopped once."},
}

// TestEveryCrashPointHeals runs one subtest per crash point, named after it.
func TestEveryCrashPointHeals(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range cases {
		seen[c.point] = true
	}
	for _, p := range crashpoint.All {
		if !seen[p] {
			t.Errorf("crash point %s has no case", p)
		}
	}
	for _, c := range cases {
		t.Run(c.point, func(t *testing.T) {
			t.Parallel()
			runCase(t, c)
		})
	}
}

// owner is the process that owns a crash point: the one dispatcher or
// watchdog, or host-a's agent.
func owner(point string) string {
	switch s := crashpoint.Service(point); s {
	case "agent":
		return "agent-host-a"
	default:
		return s + "-0"
	}
}

const jobs = 8

func runCase(t *testing.T, c crashCase) {
	t.Logf("crash point %s (hit %d): %s", c.point, c.at, c.heals)
	name := owner(c.point)
	sys := procs.Start(t, procs.Options{
		Env: map[string][]string{name: {fmt.Sprintf("%s=%s@%d", crashpoint.Env, c.point, c.at)}},
	})
	linux := []string{"self-hosted", "linux", "x64"}
	macos := []string{"self-hosted", "macos", "arm64"}
	for i := range jobs {
		labels := linux
		if i%4 == 3 {
			labels = macos
		}
		id := sys.Sim.Enqueue(ghsim.JobSpec{Labels: labels, Duration: time.Duration(300+100*(i%5)) * time.Millisecond})
		if c.deadlines && i < 2 {
			// The first attempt of the first two jobs starts no runner, on
			// whichever host it lands.
			for _, h := range []string{"host-a", "host-b"} {
				sys.Fault(h, "create-no-runner", events.AttemptID(id, 1))
			}
		}
		time.Sleep(150 * time.Millisecond) // the arrival pace, so the crash point lands mid-stream: not a wait for an outcome
	}
	if c.deadlines {
		sys.Sim.RateLimit(ghsim.RouteDeleteRunnerOrg, ghsim.TooManyRequests, 1, 20*time.Second)
	}
	p := sys.Proc(name)
	st := p.AwaitExit(t, 60*time.Second)
	if !procs.KilledBySIGKILL(st) {
		t.Fatalf("%s exited %v, not by SIGKILL at %s", name, st, c.point)
	}
	if b, _ := os.ReadFile(p.Log); !strings.Contains(string(b), "crashpoint: "+c.point) {
		t.Fatalf("%s died by SIGKILL but its log does not name %s", name, c.point)
	}
	t.Logf("%s died at %s; restarting it without the crash point", name, c.point)
	p.Restart(t)
	sys.AwaitServing(p, 30*time.Second)
	sys.AwaitQuiet(90*time.Second, func() {
		_, _, line := sys.Progress()
		t.Log(line)
	})
	sys.Verify()
}
