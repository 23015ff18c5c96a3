package scenario

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
)

// BL-25, BL-24 (cancelled while provisioning), BL-05 (a runner left
// listening for a job it will never get): given a job whose VM takes two
// seconds to boot, when the job is cancelled before any runner took it,
// then the slot is released at once (surplus demand), before the create
// returns, and the teardown is requested; once the create returns, the VM,
// whose runner is listening with nothing to take, is stopped exactly once,
// its runner process is gone, and the host is empty.
func TestAJobCancelledWhileItsVMBootsReleasesTheSlotAtOnceAndStopsTheVMOnceItIsUp(t *testing.T) {
	w := start(t, nil)
	w.fault("host-a", "create-slow", "* 2")

	j := w.enqueue(linuxLabels, 200*time.Millisecond)
	a := events.AttemptID(j, 1)
	w.await("the VM is booting", 10*time.Second, func() bool { return w.calls("host-a", "create", a).inFlight() })
	if !w.f.Sim.Cancel(j) {
		t.Fatal("the simulator refused to cancel the queued job")
	}
	rel := w.awaitFact(events.TypeSlotReleased, a, 3*time.Second)
	if r := rel.Data.(*events.SlotReleased).Reason; r != events.ReleaseSurplus {
		t.Errorf("released for %q, want %q", r, events.ReleaseSurplus)
	}
	if !w.calls("host-a", "create", a).inFlight() {
		t.Fatal("the create returned before the release: the scenario did not hold the boot open")
	}
	w.awaitFact(events.TypeAttemptTeardownRequested, a, 3*time.Second)

	started := w.awaitFact(events.TypeAttemptRunnerStarted, a, 10*time.Second)
	stopped := w.awaitFact(events.TypeAttemptStopped, a, 10*time.Second)
	if rel.Seq > started.Seq || started.Seq > stopped.Seq {
		t.Errorf("seqs: released %d, runner started %d, stopped %d; want the release first, the stop last", rel.Seq, started.Seq, stopped.Seq)
	}
	w.stoppedExactlyOnce("host-a", a)
	w.await("the listening runner is gone", 5*time.Second, func() bool { return !w.runnerAlive("host-a", a) })
	for _, r := range w.f.Sim.Runners() {
		if r.Name == a && r.JobID != 0 {
			t.Errorf("the cancelled job's runner was handed job %d", r.JobID)
		}
	}
	if v := w.job(j); v.Conclusion != "cancelled" || v.RunnerName != "" {
		t.Errorf("job ended %q on %q, want cancelled before any runner", v.Conclusion, v.RunnerName)
	}
	w.await("nothing held or alive", 5*time.Second, func() bool {
		st := w.status()
		return poolStatus(st, "linux").Held == 0 && hostStatus(st, "host-a").LiveVMs == 0 && len(w.vms("host-a")) == 0
	})
	w.checkLedger()
}

// BL-30: given a job running on attempt 1, when GitHub reports it
// completed as cancelled while its runner process does not exit by itself,
// and the first stop fails, then the slot is released at the completion,
// the agent retries the stop with back-off until it succeeds, the runner
// process is gone and the host empty, and the next job gets a VM of its own.
func TestACancelledJobsVMIsStoppedEvenThoughItsRunnerNeverExits(t *testing.T) {
	w := start(t, func(c *config.Config) { execOf(&c.Agents[0]).RetryBase = 300 * time.Millisecond })
	w.fault("host-a", "stop-fail", "*")

	j := w.enqueue(linuxLabels, 30*time.Second)
	a := events.AttemptID(j, 1)
	w.await("the job runs on attempt 1", 15*time.Second, func() bool {
		v := w.job(j)
		return v.Status == "in_progress" && v.RunnerName == a
	})
	w.deliverCompleted(j, "cancelled")
	rel := w.awaitFact(events.TypeSlotReleased, a, 3*time.Second)
	if r := rel.Data.(*events.SlotReleased).Reason; r != events.ReleaseCompleted {
		t.Errorf("released for %q, want %q", r, events.ReleaseCompleted)
	}
	w.await("the first stop fails", 5*time.Second, func() bool { return len(w.calls("host-a", "stop", a).statuses) >= 1 })
	if !w.runnerAlive("host-a", a) {
		t.Fatal("the runner exited although the stop failed: the scenario needs a runner that does not exit by itself")
	}
	if p := poolStatus(w.status(), "linux"); p.Held != 0 {
		t.Errorf("%d slots held while the VM of a cancelled job lingers", p.Held)
	}

	w.clearFault("host-a", "stop-fail")
	stopped := w.awaitFact(events.TypeAttemptStopped, a, 10*time.Second)
	if stopped.Seq < rel.Seq {
		t.Error("stopped before released")
	}
	c := w.calls("host-a", "stop", a)
	if c.starts < 2 || c.statuses[0] == "0" || c.statuses[len(c.statuses)-1] != "0" {
		t.Errorf("stop calls %+v: want a failure, retried until one succeeded", c)
	}
	if n := len(w.facts(events.TypeAttemptStopped, a)); n != 1 {
		t.Errorf("%d stopped facts", n)
	}
	w.await("the runner is gone", 5*time.Second, func() bool { return !w.runnerAlive("host-a", a) })
	w.await("the host is empty", 5*time.Second, func() bool { return len(w.vms("host-a")) == 0 })

	j2 := w.enqueue(linuxLabels, 200*time.Millisecond)
	w.await("the next job completed", 15*time.Second, w.jobIs(j2, "completed"))
	if got := w.job(j2).RunnerName; got != events.AttemptID(j2, 1) {
		t.Errorf("the next job ran on %q", got)
	}
	w.checkLedger()
}

// BL-14, BL-11, BL-09, issue 17 (law 11: blame the culprit): given a job
// whose every VM boots but never registers a runner (an image whose runner
// GitHub no longer accepts), when attempts miss the registration deadline
// again and again, then each release is charged to the image, not the job:
// the job is never given up as unschedulable and spends none of its
// max_attempts, each failed VM is stopped exactly once, and the host is
// marked degraded charged to its image with a pool alarm; when the image
// is fixed, a probe placement serves the job and the host recovers once
// that runner ran its job. (Before issue 17 the job was declared
// unschedulable after max_attempts: the host's fault was charged to it.)
func TestAJobWhoseRunnersNeverRegisterKeepsItsAttemptsAndTheImageIsBlamed(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Watchdog.RegistrationTimeout = 2 * time.Second
		culpritTune(c) // max_attempts 2, degraded after 3, probes after 1 s up to 4 s
	})
	w.fault("host-a", "create-no-runner", "*")

	j := w.enqueue(linuxLabels, 200*time.Millisecond)
	w.await("host-a degraded", 40*time.Second, func() bool { return w.hostFact(events.TypeHostDegraded, "host-a", 0) != nil })
	deg := w.hostFact(events.TypeHostDegraded, "host-a", 0)
	if d := deg.Data.(*events.HostDegraded); d.Culprit != events.CulpritImage {
		t.Errorf("host-a degraded %+v, want it charged to the image", d)
	}
	w.await("the pool alarm for host-a", 10*time.Second, func() bool {
		return w.alarm(events.TypeAlarmRaised, events.AlarmHostDegraded+"/linux/host-a")
	})
	if lost := w.attemptsKept([]int64{j}); len(lost) > 0 {
		t.Fatalf("the job lost an attempt or was given up on for the image's fault")
	}
	if st := w.status(); st.Jobs.Unschedulable != 0 || poolStatus(st, "linux").PendingDemand+poolStatus(st, "linux").Held == 0 {
		t.Errorf("status jobs %+v, linux %+v: want the job still demand (waiting or booked)", st.Jobs, poolStatus(st, "linux"))
	}
	for n := 1; n <= 3; n++ {
		a := events.AttemptID(j, n)
		r := w.facts(events.TypeSlotReleased, a)
		if len(r) != 1 || r[0].Data.(*events.SlotReleased).Reason != events.ReleaseRegistration ||
			r[0].Data.(*events.SlotReleased).Culprit != events.CulpritImage {
			t.Errorf("%s releases %v, want one for %s charged to the image", a, r, events.ReleaseRegistration)
		}
		w.awaitFact(events.TypeAttemptStopped, a, 5*time.Second)
		w.stoppedExactlyOnce("host-a", a)
	}

	// The image is fixed: a probe serves the job, and the host recovers.
	w.clearFault("host-a", "create-no-runner")
	w.await("the job completed", 40*time.Second, w.jobIs(j, "completed"))
	w.await("host-a recovered", 20*time.Second, func() bool {
		return w.hostFact(events.TypeHostRecovered, "host-a", deg.Seq) != nil
	})
	if lost := w.attemptsKept([]int64{j}); len(lost) > 0 {
		t.Errorf("the job lost an attempt or was given up on")
	}
	j2 := w.enqueue(linuxLabels, 200*time.Millisecond)
	w.await("the next job completed", 20*time.Second, w.jobIs(j2, "completed"))
	w.await("nothing held", 10*time.Second, func() bool { return poolStatus(w.status(), "linux").Held == 0 })
	w.checkLedger()
}
