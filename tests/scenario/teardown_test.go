package scenario

import (
	"context"
	"slices"
	"testing"
	"time"

	"fmt"
	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/testkit"
)

// BL-01 (law 2, law 3): given a host whose stop step never returns, when a
// job completes, then the dispatcher's completion handler releases the slot
// at once; the watchdog's sweep still runs and abandons the wedged teardown
// at its deadline while the stop is still in flight; both loops keep
// answering, /healthz lists the abandoned VM, and the next job is served.
func TestAWedgedStopBlocksNeitherTheCompletionHandlerNorTheWatchdogSweep(t *testing.T) {
	w := start(t, func(c *config.Config) {
		execOf(&c.Agents[0]).StopTimeout = 30 * time.Second // the stop stays wedged for the whole test
		c.Watchdog.TeardownTimeout = time.Second
		c.Watchdog.AbandonedCap = 5
	})
	w.fault("host-a", "stop-hang", "*")

	j1 := w.enqueue(linuxLabels, 200*time.Millisecond)
	a1 := events.AttemptID(j1, 1)
	w.await("job 1 completed", 15*time.Second, w.jobIs(j1, "completed"))
	completedAt := w.job(j1).CompletedAt

	rel := w.awaitFact(events.TypeSlotReleased, a1, 3*time.Second)
	if took := rel.Time.Sub(completedAt); took > 2*time.Second {
		t.Errorf("slot released %s after the job completed: the completion handler waited", took)
	}
	if r := rel.Data.(*events.SlotReleased).Reason; r != events.ReleaseCompleted {
		t.Errorf("release reason %q, want %q", r, events.ReleaseCompleted)
	}
	w.await("the stop of attempt 1 is called and hangs", 5*time.Second, func() bool { return w.calls("host-a", "stop", a1).inFlight() })

	ab := w.awaitFact(events.TypeAttemptAbandoned, a1, 5*time.Second)
	if d := ab.Data.(*events.AttemptAbandoned); d.Step != "stop" || ab.Source != "berth/watchdog" {
		t.Errorf("abandoned by %s at step %q, want the watchdog's teardown deadline", ab.Source, d.Step)
	}
	if !w.calls("host-a", "stop", a1).inFlight() {
		t.Fatal("the stop returned before the watchdog abandoned it: the scenario did not hold the stop open")
	}

	// Both loops still turn and answer.
	ctx, cancel := context.WithTimeout(w.ctx, time.Second)
	defer cancel()
	if err := w.f.Sys.Dispatcher.Read(ctx, func(*events.Fleet) {}); err != nil {
		t.Errorf("dispatcher loop blocked: %v", err)
	}
	if idle := time.Since(w.f.Sys.Watchdog.Loop.LastProgress()); idle > 3*time.Second {
		t.Errorf("watchdog loop idle for %s while a stop hangs", idle)
	}
	// Health is refreshed once a second: poll it, with a deadline.
	testkit.Poll(t, w.ctx, 5*time.Second, 100*time.Millisecond, "watchdog /healthz 200 listing "+a1+" as abandoned", func(context.Context) error {
		if code, body := w.healthz(w.f.Sys.WatchdogAddr); code != 200 || !listsAbandoned(body, a1) {
			return fmt.Errorf("/healthz %d %v", code, body)
		}
		return nil
	})
	if code, body := w.healthz(w.f.Sys.AgentAddrs["host-a"]); code != 200 {
		t.Errorf("agent /healthz %d %v while one of its stops hangs", code, body)
	}

	// New work flows while the stop is still wedged.
	j2 := w.enqueue(linuxLabels, 200*time.Millisecond)
	w.await("job 2 completed", 15*time.Second, w.jobIs(j2, "completed"))
	if got := w.job(j2).RunnerName; got != events.AttemptID(j2, 1) {
		t.Errorf("job 2 ran on %q", got)
	}
	if !w.calls("host-a", "stop", a1).inFlight() {
		t.Error("the wedged stop returned during the test; nothing above was proven under a wedge")
	}
	if n := len(w.facts(events.TypeSlotReleased, a1)); n != 1 {
		t.Errorf("slot of attempt 1 released %d times", n)
	}
}

// BL-01, BL-04, BL-06 (law 2): given a host with ONE slot whose stop is
// held open, when its job completes, then while the teardown is still in
// flight the ledger already shows the slot released (before the teardown
// request), the VM still counted on the host and alive in the backend, and
// the next job takes the slot; when the stop finally returns, the VM is
// recorded stopped once, and nothing is left held or alive.
func TestTheSlotIsFreeWhileTeardownIsStillInFlight(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Agents = []config.Agent{host("host-a", 2, linux(1))}
		execOf(&c.Agents[0]).StopTimeout = 30 * time.Second
		c.Watchdog.TeardownTimeout = 30 * time.Second
	})
	w.fault("host-a", "stop-hang", "*")

	j1 := w.enqueue(linuxLabels, 200*time.Millisecond)
	a1 := events.AttemptID(j1, 1)
	w.await("job 1 completed", 15*time.Second, w.jobIs(j1, "completed"))
	w.await("the stop of attempt 1 is in flight", 5*time.Second, func() bool { return w.calls("host-a", "stop", a1).inFlight() })

	// During the teardown: the ledger.
	rel := w.facts(events.TypeSlotReleased, a1)
	td := w.facts(events.TypeAttemptTeardownRequested, a1)
	if len(rel) != 1 || len(td) != 1 {
		t.Fatalf("during teardown: %d releases, %d teardown requests of attempt 1, want 1 and 1", len(rel), len(td))
	}
	if rel[0].Seq > td[0].Seq {
		t.Errorf("slot released at seq %d after the teardown request at %d: the release waited", rel[0].Seq, td[0].Seq)
	}
	if n := len(w.facts(events.TypeAttemptStopped, a1)); n != 0 {
		t.Fatalf("attempt 1 stopped while its stop hangs")
	}
	st := w.status()
	if p := poolStatus(st, "linux"); p.Held != 0 || len(p.HeldBy) != 0 {
		t.Errorf("during teardown the pool holds %d slots (%v), want 0", p.Held, p.HeldBy)
	}
	if h := hostStatus(st, "host-a"); h.LiveVMs != 1 {
		t.Errorf("during teardown host-a counts %d live VMs, want 1 (the VM being torn down)", h.LiveVMs)
	}
	if vms := w.vms("host-a"); !slices.Equal(vms, []string{a1}) {
		t.Errorf("backend inventory during teardown %v, want [%s]", vms, a1)
	}

	// The one slot serves the next job while attempt 1's teardown is in flight.
	j2 := w.enqueue(linuxLabels, 200*time.Millisecond)
	a2 := events.AttemptID(j2, 1)
	w.await("job 2 completed", 15*time.Second, w.jobIs(j2, "completed"))
	if got := w.job(j2).RunnerName; got != a2 {
		t.Errorf("job 2 ran on %q, want %s", got, a2)
	}
	if !w.calls("host-a", "stop", a1).inFlight() {
		t.Fatal("attempt 1's stop returned before job 2 ran: the scenario did not hold it open")
	}

	w.release("host-a", "")
	for _, a := range []string{a1, a2} {
		stopped := w.awaitFact(events.TypeAttemptStopped, a, 10*time.Second)
		if stopped.Data.(*events.AttemptStopped).Late {
			t.Errorf("%s recorded stopped late; its stop returned inside its deadline", a)
		}
		if n := len(w.facts(events.TypeAttemptStopped, a)); n != 1 {
			t.Errorf("%s stopped %d times", a, n)
		}
		if c := w.calls("host-a", "stop", a); c.starts != 1 {
			t.Errorf("stop of %s called %d times, want 1", a, c.starts)
		}
	}
	w.await("nothing held or alive", 5*time.Second, func() bool {
		st := w.status()
		return poolStatus(st, "linux").Held == 0 && hostStatus(st, "host-a").LiveVMs == 0 && len(w.vms("host-a")) == 0
	})
	w.checkLedger()
}

// listsAbandoned reports whether a watchdog /healthz body lists attempt
// among its abandoned VMs.
func listsAbandoned(body map[string]any, attempt string) bool {
	detail, _ := body["detail"].(map[string]any)
	list, _ := detail["abandoned_vms"].([]any)
	for _, v := range list {
		if m, _ := v.(map[string]any); m["attempt"] == attempt {
			return true
		}
	}
	return false
}
