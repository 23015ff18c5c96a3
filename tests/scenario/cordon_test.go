package scenario

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
)

// BL-32, BL-07: given host-a with one slot busy with job 0 and job 1
// waiting for it, when an operator cordons host-a and job 0 then completes,
// then job 1 is never booked on host-a after the cordon: it waits, visible
// as pending demand beside the cordoned host, and is placed on host-b within
// a dispatch cycle of host-b coming online; the watchdog never lifts the
// operator's cordon.
func TestACordonedHostGetsNoNewBookingAndTheWaitingJobGoesElsewhere(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Agents = []config.Agent{host("host-a", 1, linux(1))}
		c.Watchdog.DemandWaitingAfter = time.Second
		c.Watchdog.DemandWaitingEvery = time.Second
	})

	j0 := w.enqueue(linuxLabels, 1500*time.Millisecond)
	a0 := events.AttemptID(j0, 1)
	w.await("job 0 runs", 15*time.Second, w.jobIs(j0, "in_progress"))
	j1 := w.enqueue(linuxLabels, 200*time.Millisecond)
	w.awaitJobFact(events.TypeJobQueued, j1, 5*time.Second)
	if n := len(w.jobFacts(events.TypeSlotReserved, j1)); n != 0 {
		t.Fatal("job 1 booked while host-a's only slot is held")
	}

	cordon := w.appendFact(events.HostCordoned{HostChange: events.HostChange{Host: "host-a", By: "ops",
		Reason: "maintenance", At: time.Now()}})
	w.await("job 0 completed and its slot released", 10*time.Second, func() bool {
		return w.job(j0).Status == "completed" && len(w.facts(events.TypeSlotReleased, a0)) == 1
	})
	bookedOnA := func() bool {
		for _, e := range w.facts(events.TypeSlotReserved, "") {
			if e.Seq > cordon.Seq && hostOfFact(e) == "host-a" {
				return true
			}
		}
		return false
	}
	released := w.facts(events.TypeSlotReleased, a0)[0]
	w.never("a booking on host-a after the cordon", 1500*time.Millisecond, bookedOnA)
	var report *events.DemandWaiting
	w.await("job 1 reported waiting after job 0's slot went back", 10*time.Second, func() bool {
		for _, e := range w.facts(events.TypeDemandWaiting, "") {
			if d := e.Data.(*events.DemandWaiting); d.Pool == "linux" && d.OldestJobID == j1 && e.Seq > released.Seq {
				report = d
			}
		}
		return report != nil
	})
	if !strings.Contains(report.Reason, "cordoned") {
		t.Errorf("job 1 reported waiting because %q; it waits because the host with a free slot is cordoned", report.Reason)
	}
	st := w.status()
	if p := poolStatus(st, "linux"); p.PendingDemand != 1 || p.Held != 0 || len(p.CordonedHosts) != 1 || p.CordonedHosts[0] != "host-a" {
		t.Errorf("linux while cordoned: %+v; want job 1 pending beside cordoned host-a, nothing held", p)
	}

	w.startAgent(host("host-b", 1, linux(1)))
	online := w.awaitHostOnline("host-b", 10*time.Second)
	booked := w.awaitJobFact(events.TypeSlotReserved, j1, 5*time.Second)
	if h := booked.Data.(*events.SlotReserved).Host; h != "host-b" {
		t.Errorf("job 1 booked on %s, want host-b", h)
	}
	if took := booked.Time.Sub(online.Time); took > time.Second {
		t.Errorf("job 1 booked %s after host-b came online; want within a dispatch cycle", took)
	}
	w.await("job 1 completed", 15*time.Second, w.jobIs(j1, "completed"))
	if bookedOnA() {
		t.Error("host-a got a booking after its cordon")
	}
	if n := len(w.facts(events.TypeHostUncordoned, "")); n != 0 {
		t.Errorf("%d uncordons: the watchdog lifted an operator's cordon", n)
	}
	if h := hostStatus(w.status(), "host-a"); !h.Cordoned || h.CordonBy != "ops" {
		t.Errorf("host-a %+v: want still cordoned by ops", h)
	}
	w.checkLedger()
}

// BL-32 (drain --wait), BL-07: given host-a with one slot running job 0
// and job 1 waiting for it, when host-a's agent is told to stop (SIGTERM:
// it drains), then host-a is marked draining and gets no new booking, job 0
// runs to completion and its VM is stopped, job 1 is reported waiting
// because of the drain, and it is placed on host-b as soon as host-b is
// online.
func TestADrainingHostFinishesItsJobAndTakesNoNewOne(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Agents = nil // host-a runs outside the harness, so that it can be told to stop
		c.Watchdog.DemandWaitingAfter = time.Second
		c.Watchdog.DemandWaitingEvery = time.Second
	})
	hostA := host("host-a", 1, linux(1))
	hostA.ShutdownTimeout = 20 * time.Second
	sigterm := w.startAgent(hostA)

	j0 := w.enqueue(linuxLabels, 2*time.Second)
	a0 := events.AttemptID(j0, 1)
	w.await("job 0 runs", 15*time.Second, w.jobIs(j0, "in_progress"))
	j1 := w.enqueue(linuxLabels, 200*time.Millisecond)
	w.awaitJobFact(events.TypeJobQueued, j1, 5*time.Second)

	sigterm()
	drain := w.awaitHostFact(events.TypeHostDraining, "host-a", 5*time.Second)
	w.await("job 0 completed on host-a", 10*time.Second, w.jobIs(j0, "completed"))
	if v := w.job(j0); v.Conclusion != "success" || v.RunnerName != a0 {
		t.Errorf("job 0 ended %q on %q: the drain must let it finish", v.Conclusion, v.RunnerName)
	}
	w.awaitFact(events.TypeAttemptStopped, a0, 10*time.Second)
	released := w.facts(events.TypeSlotReleased, a0)
	if len(released) != 1 || released[0].Data.(*events.SlotReleased).Reason != events.ReleaseCompleted {
		t.Errorf("job 0's releases %v, want one for %s", released, events.ReleaseCompleted)
	}
	bookedOnA := func() bool {
		for _, e := range w.facts(events.TypeSlotReserved, "") {
			if e.Seq > drain.Seq && hostOfFact(e) == "host-a" {
				return true
			}
		}
		return false
	}
	var report *events.DemandWaiting
	w.await("job 1 reported waiting after job 0's slot went back", 10*time.Second, func() bool {
		if bookedOnA() {
			t.Fatalf("host-a got a booking while draining\n%s", w.story())
		}
		for _, e := range w.facts(events.TypeDemandWaiting, "") {
			if d := e.Data.(*events.DemandWaiting); d.Pool == "linux" && d.OldestJobID == j1 && e.Seq > released[0].Seq {
				report = d
			}
		}
		return report != nil
	})
	if !strings.Contains(report.Reason, "draining") {
		t.Errorf("job 1 reported waiting because %q; it waits because its only host drains", report.Reason)
	}

	w.startAgent(host("host-b", 1, linux(1)))
	w.await("job 1 completed", 15*time.Second, w.jobIs(j1, "completed"))
	if r := w.jobFacts(events.TypeSlotReserved, j1); len(r) != 1 || hostOfFact(r[0]) != "host-b" {
		t.Errorf("job 1 booked %v, want once, on host-b", r)
	}
	if bookedOnA() {
		t.Error("host-a got a booking while draining")
	}
	w.checkLedger()
}

// awaitHostOnline waits for a host's online advertisement.
func (w *world) awaitHostOnline(host string, within time.Duration) events.Event {
	w.t.Helper()
	var found events.Event
	w.await(host+" online", within, func() bool {
		for _, e := range w.facts(events.TypeHostOnline, "") {
			if e.Data.(*events.HostOnline).Host == host {
				found = e
				return true
			}
		}
		return false
	})
	return found
}
