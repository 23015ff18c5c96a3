package vmagent_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent"
)

// Given a running attempt whose stop hangs past its deadline and ignores
// it, when the hung call finally returns success, then the agent records the
// VM stopped late: the abandoned VM is discharged from the host (law 3,
// BL-01) without waiting for any retry.
func TestAStopThatReturnsAfterItsDeadlineRecordsTheVMStoppedLate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(o *vmagent.Options) { o.RetryBase = time.Hour })
	const a = "berth-301-1"
	h.be.SetBehaviour("stop", a, testkit.HangThenSucceed)
	h.place(t, h.host, a, 301, []byte("jit"))
	h.wait(t, a, events.TypeAttemptRunnerStarted)
	h.teardown(t, a)
	h.wait(t, a, events.TypeAttemptAbandoned)
	if got := h.attemptFacts(a, events.TypeAttemptStopped); len(got) != 0 {
		t.Fatalf("stopped before the hung call returned: %v", got)
	}
	h.be.Late()
	st := h.wait(t, a, events.TypeAttemptStopped).Data.(*events.AttemptStopped)
	if !st.Late {
		t.Error("a stop that returned after abandonment was not recorded late")
	}
	if n := len(h.be.Calls("stop", a)); n != 1 {
		t.Errorf("stop called %d times; the retry is an hour away, want 1", n)
	}
}

// Given a stop that wedges forever the first time, when the retry back-off
// passes, then the agent calls stop again (not queued behind the wedged
// call) and a successful retry records the VM stopped late.
func TestAnAbandonedStopIsRetriedWithBackoffAndNeverQueuesBehindTheWedgedCall(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(o *vmagent.Options) { o.RetryBase = 200 * time.Millisecond })
	const a = "berth-302-1"
	h.be.SetBehaviour("stop", a, testkit.HangFirst)
	h.place(t, h.host, a, 302, []byte("jit"))
	h.wait(t, a, events.TypeAttemptRunnerStarted)
	h.teardown(t, a)
	h.wait(t, a, events.TypeAttemptAbandoned)
	st := h.wait(t, a, events.TypeAttemptStopped).Data.(*events.AttemptStopped)
	if !st.Late {
		t.Error("retry after abandonment not recorded late")
	}
	if n := len(h.be.Calls("stop", a)); n != 2 {
		t.Errorf("stop called %d times, want 2 (the wedged one and one retry)", n)
	}
}

// Given a create that overruns its deadline, the agent abandons the attempt
// and then stops the VM it may have left, without waiting for a teardown
// request: an abandoned VM always gets stop attempts.
func TestAnAbandonedCreateIsStopped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(o *vmagent.Options) { o.RetryBase = 100 * time.Millisecond })
	const a = "berth-303-1"
	h.be.SetBehaviour("create", a, testkit.Hang)
	h.place(t, h.host, a, 303, []byte("jit"))
	h.wait(t, a, events.TypeAttemptAbandoned)
	st := h.wait(t, a, events.TypeAttemptStopped).Data.(*events.AttemptStopped)
	if !st.Late {
		t.Error("stop of an abandoned create not recorded late")
	}
}
