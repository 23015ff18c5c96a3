package scenario

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
)

// Issue 17 (a): given a create that overruns its deadline after its runner
// started and took a job, when the agent abandons the create, then the VM
// is not stopped and its slot is held until the job completes; then the
// slot is released and the VM torn down, once.
func TestACreateThatOverrunsWhileItsRunnerRunsAJobKeepsItsVMUntilTheJobEnds(t *testing.T) {
	w := start(t, func(c *config.Config) { execOf(&c.Agents[0]).CreateTimeout = 3 * time.Second })
	w.fault("host-a", "create-linger", "berth-*-1")

	j := w.enqueue(linuxLabels, 8*time.Second)
	a1 := events.AttemptID(j, 1)
	w.await("the job runs on attempt 1", 10*time.Second, w.jobIs(j, "in_progress"))
	if got := w.job(j).RunnerName; got != a1 {
		t.Fatalf("the job runs on %q, want %s", got, a1)
	}
	w.awaitFact(events.TypeAttemptBound, a1, 5*time.Second)
	ab := w.awaitFact(events.TypeAttemptAbandoned, a1, 5*time.Second)
	if d := ab.Data.(*events.AttemptAbandoned); d.Step != "create" {
		t.Fatalf("attempt 1 abandoned at step %q, want create", d.Step)
	}
	w.never("a stop, a release or a teardown of the VM that runs the job", 3*time.Second, func() bool {
		return w.calls("host-a", "stop", a1).starts > 0 || len(w.facts(events.TypeSlotReleased, a1)) > 0 ||
			len(w.facts(events.TypeAttemptTeardownRequested, a1)) > 0
	})
	if !w.runnerAlive("host-a", a1) {
		t.Fatal("the runner of the running job is gone")
	}
	w.await("the job completed", 15*time.Second, w.jobIs(j, "completed"))
	if v := w.job(j); v.Conclusion != "success" {
		t.Errorf("the job ended %q, want success: its VM must run it to the end", v.Conclusion)
	}
	w.awaitFact(events.TypeAttemptStopped, a1, 10*time.Second)
	rel := w.facts(events.TypeSlotReleased, a1)
	if len(rel) != 1 || rel[0].Data.(*events.SlotReleased).Reason != events.ReleaseCompleted {
		t.Errorf("attempt 1's releases %v, want one, as completed", rel)
	}
	if n := len(w.facts(events.TypeSlotReserved, events.AttemptID(j, 2))); n != 0 {
		t.Errorf("the job was booked again (%d) while its runner ran it", n)
	}
	w.stoppedExactlyOnce("host-a", a1)
	w.checkLedger()
}

// Issue 17 (d): given a host with an abandoned VM (its stop hung past its
// deadline), when its agent drains (SIGTERM), then the drain counts that
// VM and waits for it: the late stop, returning during the drain, is
// recorded (a drain that counted it as gone exited at once and lost it).
func TestADrainWaitsForTheLateStopOfAnAbandonedVM(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Agents = nil // host-a runs outside the harness, so that it can be told to stop
		c.Watchdog.TeardownTimeout = time.Minute
	})
	hostA := host("host-a", 2, linux(2))
	hostA.ShutdownTimeout = 30 * time.Second
	w.complete(&hostA)
	execOf(&hostA).StopTimeout = time.Second
	sigterm := w.startAgent(hostA)
	w.fault("host-a", "stop-hang", "berth-*-1")

	j := w.enqueue(linuxLabels, 200*time.Millisecond)
	a1 := events.AttemptID(j, 1)
	w.await("the job completed", 15*time.Second, w.jobIs(j, "completed"))
	w.awaitFact(events.TypeAttemptAbandoned, a1, 10*time.Second)

	sigterm() // the agent drains; its health endpoint is down already
	w.awaitHostFact(events.TypeHostDraining, "host-a", 5*time.Second)
	// Released after the drain began: only an agent still draining, one
	// that counts the abandoned VM, is there to record the late stop.
	w.never("a stop of the abandoned VM while its stop hangs", 2*time.Second, w.has(events.TypeAttemptStopped, a1))
	w.release("host-a", a1)
	late := w.awaitFact(events.TypeAttemptStopped, a1, 10*time.Second)
	if !late.Data.(*events.AttemptStopped).Late {
		t.Error("the abandoned VM's stop is not recorded late")
	}
}
