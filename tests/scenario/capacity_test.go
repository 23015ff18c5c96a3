package scenario

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
)

// BL-01, BL-28 (law 3): given a host whose stops never return, when its
// abandoned VMs reach the cap, then the watchdog cordons it and no new job
// is booked there, while the agent keeps retrying the stops; when one late
// stop returns, the cordon lifts by itself and the waiting job is placed;
// when every stop returns, nothing is left abandoned, cordoned or alive.
func TestTheAbandonedCapCordonsTheHostAndALateStopLiftsIt(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Agents = []config.Agent{host("host-a", 4, linux(2))} // physical room is not what stops placements here
		execOf(&c.Agents[0]).StopTimeout = 400 * time.Millisecond
		execOf(&c.Agents[0]).RetryBase = 100 * time.Millisecond
		c.Watchdog.TeardownTimeout = 30 * time.Second
		c.Watchdog.AbandonedCap = 2
	})
	w.fault("host-a", "stop-hang", "*")

	j1 := w.enqueue(linuxLabels, 200*time.Millisecond)
	j2 := w.enqueue(linuxLabels, 200*time.Millisecond)
	a1, a2 := events.AttemptID(j1, 1), events.AttemptID(j2, 1)
	for _, a := range []string{a1, a2} {
		w.awaitFact(events.TypeAttemptAbandoned, a, 15*time.Second)
	}
	cordon := w.awaitHostFact(events.TypeHostCordoned, "host-a", 5*time.Second)
	if by := cordon.Data.(*events.HostCordoned).By; by != "watchdog" {
		t.Errorf("cordoned by %q, want the watchdog", by)
	}
	w.await("status shows the cordon and both abandoned VMs", 3*time.Second, func() bool {
		st := w.status()
		h, p := hostStatus(st, "host-a"), poolStatus(st, "linux")
		return h.Cordoned && h.CordonBy == "watchdog" && h.AbandonedVMs == 2 && p.AbandonedVMs == 2 &&
			len(p.CordonedHosts) == 1 && len(st.Abandoned) == 2
	})

	j3 := w.enqueue(linuxLabels, 200*time.Millisecond)
	w.await("job 3 is demand", 5*time.Second, func() bool { return len(w.jobFacts(events.TypeJobQueued, j3)) == 1 })
	w.never("job 3 booked on the cordoned host", 1500*time.Millisecond, func() bool {
		return len(w.jobFacts(events.TypeSlotReserved, j3)) > 0
	})
	if p := poolStatus(w.status(), "linux"); p.PendingDemand != 1 || p.Held != 0 {
		t.Errorf("while cordoned: pending demand %d, held %d; want the job visible as waiting, no slot held", p.PendingDemand, p.Held)
	}
	w.await("the agent retries the abandoned VM's stop", 5*time.Second, func() bool { return w.calls("host-a", "stop", a1).starts >= 2 })

	// A late stop: attempt 1's next retry returns.
	w.release("host-a", a1)
	late := w.awaitFact(events.TypeAttemptStopped, a1, 10*time.Second)
	if !late.Data.(*events.AttemptStopped).Late {
		t.Error("the late stop is not recorded late")
	}
	lift := w.awaitHostFact(events.TypeHostUncordoned, "host-a", 5*time.Second)
	if by := lift.Data.(*events.HostUncordoned).By; by != "watchdog" || lift.Seq < late.Seq {
		t.Errorf("uncordoned by %q at seq %d (late stop at %d): want the watchdog, after the late stop", by, lift.Seq, late.Seq)
	}
	w.await("job 3 completed", 15*time.Second, w.jobIs(j3, "completed"))
	if r := w.jobFacts(events.TypeSlotReserved, j3); len(r) != 1 || r[0].Seq < lift.Seq {
		t.Errorf("job 3 booked %d times, first at seq %v; want once, after the cordon lifted at seq %d", len(r), r, lift.Seq)
	}

	w.release("host-a", "")
	w.await("nothing abandoned, cordoned, held or alive", 20*time.Second, func() bool {
		st := w.status()
		h := hostStatus(st, "host-a")
		return !h.Cordoned && h.AbandonedVMs == 0 && h.LiveVMs == 0 && len(st.Abandoned) == 0 &&
			poolStatus(st, "linux").Held == 0 && len(w.vms("host-a")) == 0
	})
	w.checkLedger()
}

// BL-01, BL-28 (law 2, law 3, law 6): given host-a (four job slots but a
// physical cap of 2, like a Mac) whose stops never return, when two jobs
// complete on it, then their slots are released once each while their VMs
// keep occupying host-a (abandoned, never more than 2 alive, stops retried
// with back-off); the next job is not placed on host-a but waits, reported
// as waiting for physical room, and goes to host-b as soon as host-b is
// online; when the stops return late, host-a is empty again.
func TestHungStopsHoldPhysicalCapacitySoTheNextJobWaitsOrGoesToAnotherHost(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Agents = []config.Agent{host("host-a", 2, linux(4))}
		execOf(&c.Agents[0]).StopTimeout = 400 * time.Millisecond
		execOf(&c.Agents[0]).RetryBase = 100 * time.Millisecond
		c.Watchdog.AbandonedCap = 0 // no cordon: physical capacity alone must keep host-a out
		c.Watchdog.DemandWaitingAfter = time.Second
	})
	w.fault("host-a", "stop-hang", "*")

	j1 := w.enqueue(linuxLabels, 200*time.Millisecond)
	j2 := w.enqueue(linuxLabels, 200*time.Millisecond)
	a1, a2 := events.AttemptID(j1, 1), events.AttemptID(j2, 1)
	for _, a := range []string{a1, a2} {
		w.awaitFact(events.TypeAttemptAbandoned, a, 15*time.Second)
	}
	withinCap := func() bool {
		h := hostStatus(w.status(), "host-a")
		if h.LiveVMs > h.PhysicalCap || len(w.vms("host-a")) > 2 {
			t.Fatalf("host-a runs %d VMs (backend: %v) over its physical cap %d", h.LiveVMs, w.vms("host-a"), h.PhysicalCap)
		}
		return true
	}
	if h := hostStatus(w.status(), "host-a"); h.LiveVMs != 2 || h.AbandonedVMs != 2 {
		t.Fatalf("host-a: %d live, %d abandoned VMs; want both hung VMs counted", h.LiveVMs, h.AbandonedVMs)
	}
	if p := poolStatus(w.status(), "linux"); p.Held != 0 {
		t.Errorf("%d slots held after both jobs completed", p.Held)
	}

	j3 := w.enqueue(linuxLabels, 200*time.Millisecond)
	var report *events.DemandWaiting
	w.await("job 3 reported waiting", 10*time.Second, func() bool {
		withinCap()
		for _, e := range w.facts(events.TypeDemandWaiting, "") {
			if d := e.Data.(*events.DemandWaiting); d.Pool == "linux" && d.OldestJobID == j3 {
				report = d
				return true
			}
		}
		return false
	})
	if !strings.Contains(report.Reason, "physical") {
		t.Errorf("job 3 reported waiting because %q; it waits for physical room, not for a slot", report.Reason)
	}
	if n := len(w.jobFacts(events.TypeSlotReserved, j3)); n != 0 {
		t.Fatalf("job 3 booked on host-a, which has no physical room")
	}
	if p := poolStatus(w.status(), "linux"); p.PendingDemand != 1 || p.WaitingForSlot != 1 {
		t.Errorf("linux: pending %d, waiting %d; want job 3 visible as waiting", p.PendingDemand, p.WaitingForSlot)
	}

	w.startAgent(host("host-b", 2, linux(2)))
	w.await("job 3 completed", 15*time.Second, func() bool { return withinCap() && w.job(j3).Status == "completed" })
	r := w.jobFacts(events.TypeSlotReserved, j3)
	if len(r) != 1 || r[0].Data.(*events.SlotReserved).Host != "host-b" {
		t.Errorf("job 3 booked %v; want once, on host-b", r)
	}
	for _, a := range []string{a1, a2} {
		if n := len(w.facts(events.TypeSlotReleased, a)); n != 1 {
			t.Errorf("%s released %d times", a, n)
		}
		w.await("the agent retries the stop of "+a, 5*time.Second, func() bool { return w.calls("host-a", "stop", a).starts >= 2 })
	}

	w.release("host-a", "")
	// The stops back off (200 ms doubling, up to 12.8 s here): the next try
	// after the release may be that far away.
	w.await("host-a empty after the late stops", 30*time.Second, func() bool {
		h := hostStatus(w.status(), "host-a")
		return withinCap() && h.LiveVMs == 0 && h.AbandonedVMs == 0 && len(w.vms("host-a")) == 0
	})
	for _, a := range []string{a1, a2} {
		if s := w.facts(events.TypeAttemptStopped, a); len(s) != 1 || !s[0].Data.(*events.AttemptStopped).Late {
			t.Errorf("%s stopped facts %v; want one, late", a, s)
		}
	}
	w.checkLedger()
}

// awaitHostFact waits for the first fact of a type about a host.
func (w *world) awaitHostFact(typ, host string, within time.Duration) events.Event {
	w.t.Helper()
	var found events.Event
	w.await(typ+" for "+host, within, func() bool {
		for _, e := range w.facts(typ, "") {
			if hostOfFact(e) == host {
				found = e
				return true
			}
		}
		return false
	})
	return found
}
