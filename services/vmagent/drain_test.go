package vmagent_test

import (
	"context"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/eventlog"
	"github.com/berth-ci/berth/services/testkit"
	"github.com/berth-ci/berth/services/vmagent"
)

// Given an agent with a drain timeout and a VM running a job, when it gets
// SIGTERM (its context ends), then it announces "host draining", keeps
// serving its running VM, refuses a placement that arrives during the drain
// without spending the job's attempts, and exits once the job's teardown has
// stopped the VM.
func TestSigtermDrainsRunningJobsThenExits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(o *vmagent.Options) { o.ShutdownTimeout = time.Minute })
	const running, late = "berth-401-1", "berth-402-1"
	h.place(t, h.host, running, 401, []byte("jit"))
	h.wait(t, running, events.TypeAttemptRunnerStarted)

	stopped := make(chan struct{})
	go func() { h.stop(); close(stopped) }()
	h.waitN(t, "host draining", 1, func(e events.Event) bool { _, ok := e.Data.(*events.HostDraining); return ok })

	h.place(t, h.host, late, 402, []byte("jit"))
	f := h.wait(t, late, events.TypeAttemptFailed).Data.(*events.AttemptFailed)
	if f.Step != events.StepDrain {
		t.Errorf("placement during a drain failed at step %q, want %q", f.Step, events.StepDrain)
	}
	if n := len(h.be.Calls("create", late)); n != 0 {
		t.Errorf("created %d VMs on a draining host", n)
	}
	select {
	case <-stopped:
		t.Fatal("agent exited while a job was still running")
	case <-time.After(300 * time.Millisecond):
	}

	h.teardown(t, running) // the job completed: the dispatcher released and asked for teardown
	h.wait(t, running, events.TypeAttemptStopped)
	select {
	case <-stopped:
	case <-time.After(waitLimit):
		t.Fatal("agent did not exit after its last VM stopped")
	}
}

// Given a drain whose running job outlives the shutdown timeout, the agent
// stops the VM itself (bounded) and exits.
func TestDrainTimeoutStopsWhatIsLeft(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(o *vmagent.Options) { o.ShutdownTimeout = 300 * time.Millisecond })
	const a = "berth-403-1"
	h.place(t, h.host, a, 403, []byte("jit"))
	h.wait(t, a, events.TypeAttemptRunnerStarted)
	start := time.Now()
	h.stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("drain took %v with a 300ms shutdown timeout", took)
	}
	h.wait(t, a, events.TypeAttemptStopped)
	if n := len(h.be.Calls("stop", a)); n != 1 {
		t.Errorf("stop called %d times, want 1", n)
	}
}

// Given a running agent whose host the watchdog reported lost (a pause or a
// partition longer than the heartbeat TTL), the agent announces the host
// online again, so it comes back without a restart.
func TestAnAgentThatSeesItsHostLostAnnouncesItAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	onlines := func() int {
		return len(h.find(func(e events.Event) bool { _, ok := e.Data.(*events.HostOnline); return ok }))
	}
	before := onlines()
	h.append(t, &events.HostLost{HostChange: events.HostChange{Host: h.host, Reason: "test", At: time.Now()}})
	h.waitN(t, "a second host online", before+1, func(e events.Event) bool { _, ok := e.Data.(*events.HostOnline); return ok })
}

// Given a running agent whose host a watchdog with a clock an hour ahead
// reported lost (the fact stamped an hour in the future), when the agent
// announces the host again, then the host is online in the log and the
// agent stops announcing: the announcement stored after the loss wins,
// whatever their stamps say (law 10: order comes from the log).
func TestALossStampedInTheFutureDoesNotOutliveTheReannouncement(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	isOnline := func(e events.Event) bool { _, ok := e.Data.(*events.HostOnline); return ok }
	before := len(h.find(isOnline))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ahead := time.Now().Add(time.Hour)
	lost := events.HostLost{HostChange: events.HostChange{Host: h.host, Reason: "test", By: "watchdog", At: ahead}}
	if _, _, err := h.app.Append(ctx, h.app.New(ahead, lost), nil); err != nil {
		t.Fatal(err)
	}
	h.waitN(t, "the host announced again", before+1, isOnline)
	testkit.Eventually(t, waitLimit, "the host online in the log", func() bool {
		f, err := eventlog.Replay(ctx, h.js, nil)
		return err == nil && f.Hosts[h.host] != nil && f.Hosts[h.host].State == events.HostStateOnline
	})
	testkit.Consistently(t, vmagent.ReannounceEvery+2*time.Second, "no further announcement", func() bool {
		return len(h.find(isOnline)) == before+1
	})
}

// Given a drain whose forced stop wedges forever (a hypervisor call that
// never returns), the drain still ends within its bounds: the stop is
// abandoned under its deadline and the agent exits (law 3).
func TestDrainWithAWedgedStopStillEnds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(o *vmagent.Options) { o.ShutdownTimeout = 300 * time.Millisecond })
	const a = "berth-404-1"
	h.be.SetBehaviour("stop", a, testkit.Hang)
	h.place(t, h.host, a, 404, []byte("jit"))
	h.wait(t, a, events.TypeAttemptRunnerStarted)
	start := time.Now()
	h.stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("drain with a wedged stop took %v; shutdown 300ms + stop deadline 300ms", took)
	}
	h.wait(t, a, events.TypeAttemptAbandoned)
}
