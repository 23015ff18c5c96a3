package dispatch_test

import (
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/dispatch"
)

// Issue 17, class 1: every failure has a culprit; only a job's own fault
// counts against its attempts (law 11).

// createFails folds attempt n of job on hostName through a failed create,
// then the round that follows it (the release the dispatcher decides).
func (l *log) createFails(job int64, n int, hostName string) dispatch.Plan {
	l.t.Helper()
	return l.createFailsCharging(job, n, hostName, events.CulpritHost)
}

// createFailsCharging is createFails with the culprit the agent writes.
func (l *log) createFailsCharging(job int64, n int, hostName, culprit string) dispatch.Plan {
	l.t.Helper()
	r := aref(job, n, hostName)
	l.add(&events.AttemptPlaced{AttemptRef: r, JobID: job, Labels: linux}, &events.AttemptProvisioning{AttemptRef: r},
		&events.AttemptFailed{AttemptRef: r, Step: "create", Error: "exit 1", Culprit: culprit})
	return l.decideAt(time.Time{})
}

func (l *log) decideAt(now time.Time) dispatch.Plan {
	l.t.Helper()
	p := params
	p.Now = now
	return dispatch.Decide(l.f, p)
}

func degraded(hostName string, at time.Time) *events.HostDegraded {
	return &events.HostDegraded{HostChange: events.HostChange{Host: hostName, Reason: "test", By: "watchdog", At: at},
		Culprit: events.CulpritHost, Failures: 3}
}

// Given a job whose every placement fails in its host's create step, when
// it has failed more than MaxAttempts times, then each release is charged
// to the host, the job keeps every attempt and is booked again, never
// unschedulable.
func TestCulpritHostCreateFailuresNeverSpendTheJobsAttempts(t *testing.T) {
	l := given(t).add(host("h-a", 2, 100), queued(7), reserved(7, 1, "h-a"))
	for n := 1; n <= 2*params.MaxAttempts; n++ {
		plan := l.createFails(7, n, "h-a")
		if len(plan.Unschedulable) != 0 {
			t.Fatalf("after %d host failures the job is given up: %+v", n, plan.Unschedulable)
		}
		if len(plan.Release) != 1 || plan.Release[0].Culprit != events.CulpritHost {
			t.Fatalf("failure %d: releases %+v, want one charged to the host", n, plan.Release)
		}
		if len(plan.Reserve) != 1 || plan.Reserve[0].N != n+1 {
			t.Fatalf("failure %d: bookings %+v, want attempt %d", n, plan.Reserve, n+1)
		}
		l.apply(plan)
	}
	if j := l.f.Jobs[7]; j.FailedAttempts != 0 || !j.Demand() {
		t.Fatalf("job 7: %d failed attempts, demand %v; want 0 and still demand", j.FailedAttempts, j.Demand())
	}
}

// Found attacking the landed code (issue 16): an agent's failure facts
// named their own culprit, and the dispatcher charged it. Given an agent
// whose creates keep failing, when it charges them to the job, then
// before this fix other repositories' jobs were given up after
// MaxAttempts; to nats or github, then they failed on it forever and it
// was never degraded. Now whatever it writes but host, image, backend or
// berth is charged to its host: the job keeps its attempts and the host's
// streak counts every failure.
func TestAnAgentCannotChargeItsFailuresToAnythingButItsHost(t *testing.T) {
	for culprit, want := range map[string]string{
		events.CulpritJob: events.CulpritHost, events.CulpritNATS: events.CulpritHost,
		events.CulpritGitHub: events.CulpritHost, "": events.CulpritHost, "nobody": events.CulpritHost,
		events.CulpritHost: events.CulpritHost, events.CulpritImage: events.CulpritImage,
		events.CulpritBackend: events.CulpritBackend, events.CulpritBerth: events.CulpritBerth,
	} {
		l := given(t).add(host("h-a", 2, 100), queued(7), reserved(7, 1, "h-a"))
		for n := 1; n <= 2*params.MaxAttempts; n++ {
			plan := l.createFailsCharging(7, n, "h-a", culprit)
			if len(plan.Unschedulable) != 0 {
				t.Fatalf("agent wrote %q: after %d failures the job is given up: %+v", culprit, n, plan.Unschedulable)
			}
			if len(plan.Release) != 1 || plan.Release[0].Culprit != want {
				t.Fatalf("agent wrote %q: failure %d: releases %+v, want one charged to %s", culprit, n, plan.Release, want)
			}
			l.apply(plan)
		}
		if j := l.f.Jobs[7]; j.FailedAttempts != 0 || !j.Demand() {
			t.Fatalf("agent wrote %q: job 7 has %d failed attempts, demand %v; want 0 and still demand", culprit, j.FailedAttempts, j.Demand())
		}
		if n, _, _ := l.f.Hosts["h-a"].Health.Streak(time.Time{}); want == events.CulpritHost && n < params.MaxAttempts {
			t.Fatalf("agent wrote %q: the host's streak is %d, want every failure charged to it", culprit, n)
		}
	}
}

// Given GitHub refusing the App's own credentials for a job's JIT config,
// many times over, then each booking goes back charged to GitHub and the
// job stays demand with all its attempts.
func TestCulpritGitHubRefusalsNeverSpendTheJobsAttempts(t *testing.T) {
	l := given(t).add(host("h-a", 2, 100), queued(8), reserved(8, 1, "h-a"))
	for n := 1; n <= 2*params.MaxAttempts; n++ {
		p := params
		p.Refused = map[string]string{attempt(8, n): events.ReleaseGitHubRefused}
		plan := dispatch.Decide(l.f, p)
		if len(plan.Unschedulable) != 0 || len(plan.Release) != 1 || plan.Release[0].Culprit != events.CulpritGitHub {
			t.Fatalf("refusal %d: plan %+v, want one release charged to github and no give-up", n, plan)
		}
		l.apply(plan)
	}
	if j := l.f.Jobs[8]; j.FailedAttempts != 0 || !j.Demand() {
		t.Fatalf("job 8: %d failed attempts, demand %v; want 0 and still demand", j.FailedAttempts, j.Demand())
	}
	if !l.f.GitHub.Refusing() || !l.f.Status().GitHub.Refused {
		t.Fatal("the fold does not show GitHub refusing")
	}
}

// Given two equally free hosts, h-a degraded, when a job is queued, then it
// is booked on the healthy h-b (h-a sorts first by name).
func TestCulpritPlacementsGoToTheHealthyHost(t *testing.T) {
	l := given(t).add(host("h-a", 2, 2), host("h-b", 2, 2), degraded("h-a", t0), queued(9))
	plan := l.decideAt(t0.Add(time.Duration(l.n) * time.Second)) // the probe's back-off has not passed
	if len(plan.Reserve) != 1 || plan.Reserve[0].Host != "h-b" {
		t.Fatalf("bookings %+v, want one on the healthy h-b", plan.Reserve)
	}
}

// Given two equally free healthy hosts, when the last placement on h-a
// failed in its create step (charged to the host), then the next booking
// goes to h-b, though h-a sorts first.
func TestCulpritWorkSpreadsAwayFromAHostWhoseLastPlacementFailed(t *testing.T) {
	r := aref(10, 1, "h-a")
	l := given(t).add(host("h-a", 2, 100), host("h-b", 2, 100), queued(10), reserved(10, 1, "h-a"),
		&events.AttemptFailed{AttemptRef: r, Step: "create", Error: "exit 1", Culprit: events.CulpritHost},
		&events.SlotReleased{Pool: "linux", Host: "h-a", Attempt: r.Attempt, Reason: events.ReleaseCreateFailed, JobID: 10,
			Culprit: events.CulpritHost},
		completed(10, "", "cancelled"), queued(11))
	plan := l.decide()
	if len(plan.Reserve) != 1 || plan.Reserve[0].Host != "h-b" {
		t.Fatalf("bookings %+v, want job 11 on h-b", plan.Reserve)
	}
}

// Given a degraded host and no other, when the back-off since its
// degradation has not passed, then nothing is booked there; once it has,
// one probe is booked, and only one while it has not started; a failed
// probe doubles the back-off.
func TestCulpritDegradedHostGetsOneProbeAfterABackOff(t *testing.T) {
	l := given(t).add(host("h-a", 4, 4), degraded("h-a", t0))
	at := t0.Add(time.Duration(l.n) * time.Second) // when the log stored the degradation
	l.add(queued(11), queued(12))
	if plan := l.decideAt(at.Add(dispatch.DefaultProbeAfter - time.Second)); len(plan.Reserve) != 0 {
		t.Fatalf("inside the back-off: bookings %+v, want none", plan.Reserve)
	}
	plan := l.decideAt(at.Add(dispatch.DefaultProbeAfter))
	if len(plan.Reserve) != 1 || plan.Reserve[0].Host != "h-a" {
		t.Fatalf("after the back-off: bookings %+v, want one probe on h-a", plan.Reserve)
	}
	l.apply(plan)
	probe := plan.Reserve[0]
	if again := l.decideAt(at.Add(time.Hour)); len(again.Reserve) != 0 {
		t.Fatalf("a probe is in flight: bookings %+v, want none", again.Reserve)
	}
	// The probe fails at t0+n s (the log's clock): the back-off doubles.
	failed := l.createFails(probe.JobID, probe.N, "h-a")
	failed.Reserve = nil
	l.apply(failed) // the release, stored at t0 + l.n s
	failedAt := t0.Add(time.Duration(l.n) * time.Second)
	if plan := l.decideAt(failedAt.Add(2*dispatch.DefaultProbeAfter - 2*time.Second)); len(plan.Reserve) != 0 {
		t.Fatalf("inside the doubled back-off: bookings %+v, want none", plan.Reserve)
	}
	if plan := l.decideAt(failedAt.Add(2 * dispatch.DefaultProbeAfter)); len(plan.Reserve) != 1 || plan.Reserve[0].Host != "h-a" {
		t.Fatalf("after the doubled back-off: bookings %+v, want one probe on h-a", plan.Reserve)
	}
}
