package scenario

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
)

// BL-02, BL-26, BL-36: given a host whose create fails for one job's first
// attempt, and hangs for another's while the host's agent crashes and
// restarts, then every slot is released exactly once on every path (failed
// create, provisioning deadline after the crash), the stop of a VM that was
// never created succeeds at once, the VM half-created before the crash is
// stopped by the restarted agent within the provisioning deadline plus a
// sweep, both jobs are served by fresh attempts, nothing stays held, a
// replay equals the live projection, and the next job is booked within one
// dispatch cycle.
func TestEveryPathOfAFailedOrInterruptedCreateReleasesItsSlotExactlyOnce(t *testing.T) {
	const provisionTimeout = 3 * time.Second
	w := start(t, func(c *config.Config) {
		c.Agents = nil // host-a runs outside the harness, so that it can crash and restart
		c.Watchdog.ProvisionTimeout = provisionTimeout
	})
	hostA := host("host-a", 2, linux(2))
	crash := w.startAgent(hostA)

	// Job 1: the create of its first attempt fails (an image that is not there).
	w.fault("host-a", "create-fail", "berth-*-1")
	j1 := w.f.Sim.Enqueue(jobSpec(linuxLabels, 200*time.Millisecond, "failure"))
	a11 := events.AttemptID(j1, 1)
	w.await("job 1 completed", 20*time.Second, w.jobIs(j1, "completed"))
	if got := w.job(j1).RunnerName; got != events.AttemptID(j1, 2) {
		t.Errorf("job 1 ran on %q, want its second attempt", got)
	}
	if r := w.facts(events.TypeSlotReleased, a11); len(r) != 1 || r[0].Data.(*events.SlotReleased).Reason != events.ReleaseCreateFailed {
		t.Errorf("attempt 1 of job 1 released %v, want once for %s", r, events.ReleaseCreateFailed)
	}
	w.awaitFact(events.TypeAttemptStopped, a11, 5*time.Second)
	w.stoppedExactlyOnce("host-a", a11) // BL-26: stopping what does not exist is success, once

	// Job 2: its first create hangs, and the agent crashes in the middle.
	w.clearFault("host-a", "create-fail")
	w.fault("host-a", "create-hang", "berth-*-1")
	j2 := w.enqueue(linuxLabels, 200*time.Millisecond)
	a21 := events.AttemptID(j2, 1)
	w.await("job 2's VM is being created", 10*time.Second, func() bool { return w.calls("host-a", "create", a21).inFlight() })
	crash()
	w.startAgent(hostA) // the restart

	w.await("job 2 completed", 20*time.Second, w.jobIs(j2, "completed"))
	if got := w.job(j2).RunnerName; got != events.AttemptID(j2, 2) {
		t.Errorf("job 2 ran on %q, want its second attempt", got)
	}
	reserved := w.facts(events.TypeSlotReserved, a21)[0]
	rel := w.facts(events.TypeSlotReleased, a21)
	if len(rel) != 1 || rel[0].Data.(*events.SlotReleased).Reason != events.ReleaseProvisionTimeout {
		t.Errorf("attempt 1 of job 2 released %v, want once for %s", rel, events.ReleaseProvisionTimeout)
	}
	stopped := w.awaitFact(events.TypeAttemptStopped, a21, 5*time.Second)
	if took := stopped.Time.Sub(reserved.Time); took > provisionTimeout+4*time.Second {
		t.Errorf("the VM left by the crash stayed %s in a transitional state; want within the provisioning deadline plus a sweep", took)
	}
	if n := len(w.facts(events.TypeAttemptStopped, a21)); n != 1 {
		t.Errorf("%d stopped facts for the interrupted attempt", n)
	}

	w.await("nothing held or alive", 10*time.Second, func() bool {
		st := w.status()
		return poolStatus(st, "linux").Held == 0 && hostStatus(st, "host-a").LiveVMs == 0 && len(w.vms("host-a")) == 0
	})
	w.checkLedger()

	j3 := w.enqueue(linuxLabels, 200*time.Millisecond)
	queued := w.awaitJobFact(events.TypeJobQueued, j3, 5*time.Second)
	booked := w.awaitJobFact(events.TypeSlotReserved, j3, 3*time.Second)
	if took := booked.Time.Sub(queued.Time); took > time.Second {
		t.Errorf("job 3 booked %s after it was queued; want within one dispatch cycle", took)
	}
	w.await("job 3 completed", 15*time.Second, w.jobIs(j3, "completed"))
}

// BL-35 (the variant where the VM survives its agent), BL-06: given a job
// running on a host whose agent then crashes, when the job completes while
// the agent is down, then its slot is released at the completion without the
// agent, and the restarted agent stops the finished job's VM within a
// sweep, once.
func TestAVMWhoseJobCompletedWhileItsAgentWasDownIsStoppedAfterTheRestart(t *testing.T) {
	w := start(t, func(c *config.Config) { c.Agents = nil })
	hostA := host("host-a", 2, linux(2))
	crash := w.startAgent(hostA)

	j := w.enqueue(linuxLabels, 1500*time.Millisecond)
	a := events.AttemptID(j, 1)
	w.await("the job runs", 15*time.Second, w.jobIs(j, "in_progress"))
	crash()

	w.await("the job completed while the agent is down", 10*time.Second, w.jobIs(j, "completed"))
	rel := w.awaitFact(events.TypeSlotReleased, a, 3*time.Second)
	if r := rel.Data.(*events.SlotReleased).Reason; r != events.ReleaseCompleted {
		t.Errorf("released for %q", r)
	}
	w.awaitFact(events.TypeAttemptTeardownRequested, a, 3*time.Second)
	if n := len(w.facts(events.TypeAttemptStopped, a)); n != 0 {
		t.Fatal("stopped while its agent was down")
	}
	if vms := w.vms("host-a"); len(vms) != 1 {
		t.Fatalf("backend inventory %v: the VM should outlive its agent", vms)
	}

	restarted := time.Now()
	w.startAgent(hostA)
	stopped := w.awaitFact(events.TypeAttemptStopped, a, 5*time.Second)
	if took := stopped.Time.Sub(restarted); took > 3*time.Second {
		t.Errorf("the VM was stopped %s after the restart; want within a sweep", took)
	}
	w.stoppedExactlyOnce("host-a", a)
	w.await("the host is empty", 5*time.Second, func() bool {
		return len(w.vms("host-a")) == 0 && hostStatus(w.status(), "host-a").LiveVMs == 0
	})
	w.checkLedger()
}

// awaitJobFact waits for the first fact of a type naming a job.
func (w *world) awaitJobFact(typ string, job int64, within time.Duration) events.Event {
	w.t.Helper()
	w.await(typ+" for a job", within, func() bool { return len(w.jobFacts(typ, job)) > 0 })
	return w.jobFacts(typ, job)[0]
}
