package scenario

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
)

// BL-11: given a first attempt whose VM boots but whose runner never
// registers, when the registration deadline passes, then the watchdog
// releases the slot once and the VM is stopped exactly once, the job is
// booked again with a fresh attempt (two reservations in all, never two at
// once), it stays queued until that runner takes it, and the first VM is
// gone from the host within the deadline plus a sweep.
func TestARunnerThatNeverRegistersIsStoppedOnceAndItsJobPlacedAgain(t *testing.T) {
	const regTimeout = 2 * time.Second
	w := start(t, func(c *config.Config) { c.Watchdog.RegistrationTimeout = regTimeout })
	w.fault("host-a", "create-no-runner", "berth-*-1")

	j := w.enqueue(linuxLabels, 200*time.Millisecond)
	a1, a2 := events.AttemptID(j, 1), events.AttemptID(j, 2)
	w.await("the job completed", 20*time.Second, w.jobIs(j, "completed"))
	if got := w.job(j).RunnerName; got != a2 {
		t.Errorf("the job ran on %q, want the second attempt %s", got, a2)
	}
	stopped := w.awaitFact(events.TypeAttemptStopped, a1, 5*time.Second)

	rel := w.facts(events.TypeSlotReleased, a1)
	if len(rel) != 1 || rel[0].Data.(*events.SlotReleased).Reason != events.ReleaseRegistration {
		t.Errorf("releases of attempt 1: %v, want one for %s", rel, events.ReleaseRegistration)
	}
	reserved := w.jobFacts(events.TypeSlotReserved, j)
	if len(reserved) != 2 {
		t.Fatalf("%d reservations for the job, want 2", len(reserved))
	}
	if reserved[1].Seq < rel[0].Seq {
		t.Errorf("attempt 2 booked (seq %d) before attempt 1 was released (seq %d): two slots for one job", reserved[1].Seq, rel[0].Seq)
	}
	started := w.facts(events.TypeAttemptRunnerStarted, a1)[0]
	if took := stopped.Time.Sub(started.Time); took > regTimeout+3*time.Second {
		t.Errorf("attempt 1's VM gone %s after its runner started; want within the registration deadline plus a sweep", took)
	}
	w.stoppedExactlyOnce("host-a", a1)
	if ip := w.jobFacts(events.TypeJobInProgress, j); len(ip) != 1 || ip[0].Data.(*events.JobInProgress).RunnerName != a2 {
		t.Errorf("in_progress facts %v: the job must only ever be taken by attempt 2", ip)
	}
	w.await("the host is empty", 5*time.Second, func() bool { return len(w.vms("host-a")) == 0 })
	w.checkLedger()
}

// Law 3, BL-36: given a first attempt whose create step hangs past its
// deadline, when the agent abandons it, then the slot is released once, the
// half-created VM is stopped exactly once (recorded late: it was
// abandoned), and the job is served by a fresh attempt.
func TestACreateThatOverrunsItsDeadlineIsStoppedOnceAndItsJobPlacedAgain(t *testing.T) {
	w := start(t, func(c *config.Config) { execOf(&c.Agents[0]).CreateTimeout = time.Second })
	w.fault("host-a", "create-hang", "berth-*-1")
	// The stop takes a second: a release that waited for it would come
	// after it. (With an instant stop the two facts raced, and CI once
	// saw the stop stored first.)
	w.fault("host-a", "stop-slow", "berth-*-1 1")

	j := w.enqueue(linuxLabels, 200*time.Millisecond)
	a1, a2 := events.AttemptID(j, 1), events.AttemptID(j, 2)
	w.await("the job completed", 20*time.Second, w.jobIs(j, "completed"))
	if got := w.job(j).RunnerName; got != a2 {
		t.Errorf("the job ran on %q, want %s", got, a2)
	}
	ab := w.awaitFact(events.TypeAttemptAbandoned, a1, time.Second)
	if d := ab.Data.(*events.AttemptAbandoned); d.Step != "create" {
		t.Errorf("attempt 1 abandoned at step %q, want create", d.Step)
	}
	stopped := w.awaitFact(events.TypeAttemptStopped, a1, 5*time.Second)
	if !stopped.Data.(*events.AttemptStopped).Late {
		t.Error("the stop of an abandoned VM is not recorded late, so it would not discharge the host")
	}
	rel := w.facts(events.TypeSlotReleased, a1)
	if len(rel) != 1 {
		t.Errorf("attempt 1 released %d times", len(rel))
	}
	if rel[0].Seq > stopped.Seq {
		t.Error("the slot went back only after the VM stopped")
	}
	w.stoppedExactlyOnce("host-a", a1)
	w.await("the host is empty", 5*time.Second, func() bool { return len(w.vms("host-a")) == 0 })
	w.checkLedger()
}

// stoppedExactlyOnce checks, for an attempt that is over, one teardown
// request at most, one stop call that returned 0, and one stopped fact.
func (w *world) stoppedExactlyOnce(host, attempt string) {
	w.t.Helper()
	if n := len(w.facts(events.TypeAttemptTeardownRequested, attempt)); n > 1 {
		w.t.Errorf("%s: %d teardown requests", attempt, n)
	}
	if n := len(w.facts(events.TypeAttemptStopped, attempt)); n != 1 {
		w.t.Errorf("%s: %d stopped facts, want 1", attempt, n)
	}
	if c := w.calls(host, "stop", attempt); c.starts != 1 || len(c.statuses) != 1 || c.statuses[0] != "0" {
		w.t.Errorf("%s: stop called %d times (returned: %v), want exactly once, successfully", attempt, c.starts, c.statuses)
	}
}
