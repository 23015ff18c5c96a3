package scenario

import (
	"net/http"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/tests/ghsim"
)

// Issue 17, class 1: every failure has a culprit; only a job's own fault
// counts against its attempts (law 11).

// culpritTune makes degradation and probes quick enough to watch: three
// failures in a row degrade a host, a probe follows after 1 s, doubled per
// failed probe up to 4 s.
func culpritTune(c *config.Config) {
	c.Watchdog.DegradeAfter = 3
	c.Dispatcher.ProbeAfter = time.Second
	c.Dispatcher.ProbeMax = 4 * time.Second
	c.Dispatcher.MaxAttempts = 2
}

// attemptsKept names the jobs that lost an attempt or were given up on,
// from the dispatcher's fold and the log.
func (w *world) attemptsKept(jobs []int64) (lost []int64) {
	w.t.Helper()
	if err := w.f.Sys.Dispatcher.Read(w.ctx, func(f *events.Fleet) {
		for _, id := range jobs {
			if j := f.Jobs[id]; j != nil && (j.FailedAttempts != 0 || j.Unschedulable) {
				lost = append(lost, id)
			}
		}
	}); err != nil {
		w.t.Fatal(err)
	}
	for _, id := range jobs {
		if len(w.jobFacts(events.TypeJobUnschedulable, id)) > 0 {
			lost = append(lost, id)
		}
	}
	return lost
}

func (w *world) allCompleted(jobs []int64) func() bool {
	return func() bool {
		for _, j := range jobs {
			if w.job(j).Status != ghsim.StatusCompleted {
				return false
			}
		}
		return true
	}
}

// hostFact finds the first fact of typ about host stored after seq.
func (w *world) hostFact(typ, host string, after uint64) *events.Event {
	for _, e := range w.facts(typ, "") {
		if e.Seq <= after {
			continue
		}
		switch d := e.Data.(type) {
		case *events.HostDegraded:
			if d.Host == host {
				return &e
			}
		case *events.HostRecovered:
			if d.Host == host {
				return &e
			}
		}
	}
	return nil
}

func (w *world) alarm(typ, key string) bool {
	for _, e := range w.facts(typ, "") {
		switch d := e.Data.(type) {
		case *events.AlarmRaised:
			if d.Key == key {
				return true
			}
		case *events.AlarmCleared:
			if d.Key == key {
				return true
			}
		}
	}
	return false
}

// Given two hosts, host-b's create failing every time, when six jobs come
// (more than host-a runs at once), then every job is served on host-a, none
// loses an attempt (max_attempts is 2) or is given up on, host-b is marked
// degraded charged to the host with a pool alarm; when the fault clears,
// a probe placement succeeds on host-b and it recovers by itself.
func TestCulpritAHostWhoseCreateAlwaysFailsIsDegradedAndNoJobLosesAnAttempt(t *testing.T) {
	w := start(t, func(c *config.Config) {
		c.Agents = []config.Agent{host("host-a", 2, linux(2)), host("host-b", 2, linux(2))}
		culpritTune(c)
	})
	w.fault("host-b", "create-fail", "*")

	var jobs []int64
	for range 6 {
		jobs = append(jobs, w.enqueue(linuxLabels, 1500*time.Millisecond))
	}
	w.await("host-b degraded", 40*time.Second, func() bool { return w.hostFact(events.TypeHostDegraded, "host-b", 0) != nil })
	deg := w.hostFact(events.TypeHostDegraded, "host-b", 0).Data.(*events.HostDegraded)
	if deg.Culprit != events.CulpritHost || deg.Failures < 3 || deg.Reason == "" {
		t.Errorf("host-b degraded %+v, want charged to the host after 3 failures, with a reason", deg)
	}
	w.await("the pool alarm for host-b", 10*time.Second, func() bool {
		return w.alarm(events.TypeAlarmRaised, events.AlarmHostDegraded+"/linux/host-b")
	})
	// The watchdog wrote the fact; the dispatcher's projection shows it once
	// its consumer has delivered it, not at the moment the log holds it.
	w.await("the dispatcher's status to show host-b degraded", 10*time.Second, func() bool {
		return hostStatus(w.status(), "host-b").Degraded
	})
	w.await("every job served", 60*time.Second, w.allCompleted(jobs))
	for _, j := range jobs {
		if a := w.attemptOf(w.job(j).RunnerName); a == nil || a.Host != "host-a" {
			t.Errorf("job %d ran on %q, want a runner booked on host-a", j, w.job(j).RunnerName)
		}
	}
	if lost := w.attemptsKept(jobs); len(lost) > 0 {
		t.Errorf("jobs %v lost an attempt or were given up on, for host-b's fault", lost)
	}
	for _, e := range w.facts(events.TypeSlotReleased, "") {
		if r := e.Data.(*events.SlotReleased); r.Host == "host-b" && r.Reason != events.ReleaseCompleted && r.Culprit != events.CulpritHost {
			t.Errorf("release on host-b %+v, want it charged to the host", r)
		}
	}

	// The fault clears: the next probe succeeds and host-b recovers.
	w.clearFault("host-b", "create-fail")
	degSeq := w.hostFact(events.TypeHostDegraded, "host-b", 0).Seq
	var more []int64
	for range 4 {
		more = append(more, w.enqueue(linuxLabels, 3*time.Second))
	}
	w.await("host-b recovered", 40*time.Second, func() bool { return w.hostFact(events.TypeHostRecovered, "host-b", degSeq) != nil })
	w.await("the pool alarm for host-b cleared", 10*time.Second, func() bool {
		return w.alarm(events.TypeAlarmCleared, events.AlarmHostDegraded+"/linux/host-b")
	})
	w.await("every later job served", 60*time.Second, w.allCompleted(more))
	if lost := w.attemptsKept(append(jobs, more...)); len(lost) > 0 {
		t.Errorf("jobs %v lost an attempt or were given up on", lost)
	}
	w.checkLedger()
}

// attemptOf is the booking of an attempt, from the log.
func (w *world) attemptOf(attempt string) *events.SlotReserved {
	for _, e := range w.facts(events.TypeSlotReserved, attempt) {
		return e.Data.(*events.SlotReserved)
	}
	return nil
}

// Given GitHub answering the JIT-config call with 401 "Bad credentials"
// for a few seconds (the App's own credentials refused), when jobs come,
// then none is dropped, loses an attempt or is given up on; meanwhile the
// dispatcher's /healthz answers 503 naming the pause, `berth status` shows
// GitHub refusing and a fleet alarm is raised; after it clears every job is
// served without an operator and the alarm clears.
func TestCulpritGitHubRefusingTheAppsCredentialsPausesAndKeepsEveryJob(t *testing.T) {
	w := start(t, culpritTune)
	sim := w.f.Sim
	sim.Unauthorized(ghsim.RouteJITConfigOrg, 4*time.Second)
	var jobs []int64
	for range 3 {
		jobs = append(jobs, w.enqueue(linuxLabels, 200*time.Millisecond))
	}
	w.await("/healthz shows the pause", 15*time.Second, func() bool {
		code, body := w.healthz(w.f.Sys.DispatcherAddr)
		detail, _ := body["detail"].(map[string]any)
		return code == http.StatusServiceUnavailable && detail["github_paused"] == "auth"
	})
	w.await("status shows GitHub refusing", 10*time.Second, func() bool { return w.status().GitHub.Refused })
	w.await("the fleet alarm", 10*time.Second, func() bool {
		return w.alarm(events.TypeAlarmRaised, events.AlarmGitHubRefused+"/fleet")
	})
	if lost := w.attemptsKept(jobs); len(lost) > 0 {
		t.Fatalf("while GitHub refused, jobs %v lost an attempt or were given up on", lost)
	}
	w.await("every job served after the refusal ends", 60*time.Second, w.allCompleted(jobs))
	if lost := w.attemptsKept(jobs); len(lost) > 0 {
		t.Errorf("jobs %v lost an attempt or were given up on, for GitHub's fault", lost)
	}
	refused := 0
	for _, e := range w.facts(events.TypeSlotReleased, "") {
		if r := e.Data.(*events.SlotReleased); r.Reason == events.ReleaseGitHubRefused {
			refused++
			if r.Culprit != events.CulpritGitHub {
				t.Errorf("release %+v, want it charged to github", r)
			}
		}
	}
	if refused == 0 {
		t.Error("no booking went back as github_refused")
	}
	w.await("the alarm cleared", 10*time.Second, func() bool {
		return w.alarm(events.TypeAlarmCleared, events.AlarmGitHubRefused+"/fleet")
	})
	w.await("/healthz healthy again", 10*time.Second, func() bool {
		code, _ := w.healthz(w.f.Sys.DispatcherAddr)
		return code == http.StatusOK
	})
	w.checkLedger()
}

// BL-14, BL-11, BL-09 under law 11: given GitHub refusing the JIT config
// for the job itself (404: the App cannot see where the job runs; neither
// an auth nor a rate answer), when every placement is refused, then each
// release is charged to the job and after max_attempts the job is given
// up as unschedulable with a reason, no further booking is made for it,
// no host is degraded, and the pool serves the next job once GitHub
// answers again.
func TestCulpritAJobRefusedByGitHubIsGivenUpAfterMaxAttempts(t *testing.T) {
	w := start(t, culpritTune) // max_attempts 2
	w.f.Sim.NotFound(ghsim.RouteJITConfigOrg, time.Hour)
	j := w.enqueue(linuxLabels, 200*time.Millisecond)
	u := w.awaitJobFact(events.TypeJobUnschedulable, j, 30*time.Second).Data.(*events.JobUnschedulable)
	if u.Attempts != 2 || u.Reason == "" {
		t.Errorf("unschedulable %+v, want after 2 attempts, with a reason", u)
	}
	w.never("a third booking for the job", 2*time.Second, func() bool {
		return len(w.jobFacts(events.TypeSlotReserved, j)) > 2
	})
	for _, e := range w.jobFacts(events.TypeSlotReleased, j) {
		if r := e.Data.(*events.SlotReleased); r.Reason != events.ReleaseMintFailed || r.Culprit != events.CulpritJob {
			t.Errorf("release %+v, want mint_failed charged to the job", r)
		}
	}
	if len(w.facts(events.TypeHostDegraded, "")) != 0 {
		t.Error("a host was degraded for the job's own fault")
	}
	st := w.status()
	if st.Jobs.Unschedulable != 1 || poolStatus(st, "linux").PendingDemand != 0 {
		t.Errorf("status jobs %+v, linux %+v: want the job unschedulable, not demand", st.Jobs, poolStatus(st, "linux"))
	}

	w.f.Sim.NotFound(ghsim.RouteJITConfigOrg, 0)
	j2 := w.enqueue(linuxLabels, 200*time.Millisecond)
	w.await("the next job completed", 20*time.Second, w.jobIs(j2, ghsim.StatusCompleted))
	w.await("nothing held", 10*time.Second, func() bool { return poolStatus(w.status(), "linux").Held == 0 })
	w.checkLedger()
}
